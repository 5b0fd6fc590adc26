"""Gradient-boosted trees as arrays: trained by scikit-learn, shipped as JSON, scored by numba.

``export(model)`` turns a fitted ``HistGradientBoostingClassifier`` (binary) into a ``Trees``
(flat node arrays: feature, threshold, left, right, leaf value; one root index per tree);
``Trees.predict(x)`` gives the same probabilities as ``model.predict_proba(x)[:, 1]`` (tested
against it) without scikit-learn's per-call checks, which cost more than the trees on a page's
few hundred blocks. Features never hold NaN here, so the missing-value branch is not stored.
Scoring reads the nodes re-laid out (``Layout``: every tree of a row walked at once, branch-free);
the sums are a tree-at-a-time walk's, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _raw(x, node, threshold, shift, value, roots, tree, deeper, baseline):  # pragma: no cover (compiled)
    """A row at a time, every tree walked at once a level at a time, without a branch (the
    trees' walks do not wait on each other): a node's children are ``child`` and ``child + 1``, a
    leaf is its own child (``Layout``); at level ``L`` only the ``deeper[L]`` trees deeper than
    ``L`` (the trees go deepest first). The leaf values are summed in the trees' own order, as a
    tree-at-a-time walk sums them (the same float result)."""
    mask = (1 << shift) - 1
    n = x.shape[0]
    out = np.empty(n)
    at = np.empty(len(roots), np.int32)
    leaf = np.empty(len(roots), np.int32)
    for i in range(n):
        row = x[i]
        for k in range(len(roots)):
            at[k] = roots[k]
        for level in range(len(deeper)):
            for k in range(deeper[level]):
                j = 2 * at[k]
                at[k] = (node[j] >> shift) + np.int32(row[node[j] & mask] > threshold[j + 1])
        for k in range(len(roots)):
            leaf[tree[k]] = at[k]
        s = 0.0
        for k in range(len(roots)):
            s += value[leaf[k]]
        out[i] = baseline + s
    return out


@dataclass
class Layout:
    """A ``Trees`` laid out for ``_raw``: per tree its nodes breadth first, so that a node's right
    child follows its left one; a leaf points at itself (feature 0, threshold +inf); thresholds as
    the largest float32 at or below them (a float32 feature is <= the float64 threshold exactly
    when it is <= that float32). A node is two int32 side by side (one cache line for both):
    ``child << shift | feature``, and the threshold's float32 bits. The trees deepest first:
    their roots, which tree each is, and per level how many are deeper than it."""

    node: np.ndarray  # int32, two per node
    shift: int
    value: np.ndarray
    roots: np.ndarray
    tree: np.ndarray
    deeper: np.ndarray

    @property
    def threshold(self) -> np.ndarray:
        return self.node.view(np.float32)  # at odd positions

    @classmethod
    def of(cls, t: "Trees") -> "Layout":
        order, depth = [], []
        for root in t.roots.tolist():
            level, d = [root], -1
            while level:  # breadth first: each node's two children side by side
                order += level
                level, d = [c for j in level if t.left[j] >= 0 for c in (t.left[j], t.right[j])], d + 1
            depth.append(d)
        return cls._from_order(t, np.asarray(order, np.int64), np.asarray(depth, np.int32))

    @classmethod
    def _from_order(cls, t: "Trees", order: np.ndarray, depth: np.ndarray) -> "Layout":
        new = np.empty(len(order), np.int64)
        new[order] = np.arange(len(order))
        leaf = t.left[order] < 0
        child = np.where(leaf, np.arange(len(order)), new[np.maximum(t.left[order], 0)])
        assert (new[t.right[order][~leaf]] == child[~leaf] + 1).all()
        thr = t.threshold[order].astype(np.float32)
        above = thr.astype(np.float64) > t.threshold[order]
        thr[above] = np.nextafter(thr[above], np.float32(-np.inf))
        thr[leaf] = np.inf
        shift = max(1, (t.n_features - 1).bit_length())
        if len(order) << shift >= 2 ** 31:
            raise ValueError(f"trees: {len(order)} nodes over {t.n_features} features do not fit the layout")
        node = np.empty(2 * len(order), np.int32)
        node[0::2] = child << shift | np.where(leaf, 0, t.feature[order])
        node.view(np.float32)[1::2] = thr
        deepest = np.argsort(-depth, kind="stable")
        deeper = np.array([(depth > level).sum() for level in range(depth.max(initial=0))], np.int64)
        return cls(node, shift, np.where(leaf, t.value[order], 0.0), new[t.roots][deepest].astype(np.int32),
                   deepest.astype(np.int32), deeper)


@dataclass
class Trees:
    """A binary tree ensemble: leaf values summed, plus the baseline, through a sigmoid."""

    feature: np.ndarray  # int32 per node (-1 at a leaf)
    threshold: np.ndarray  # float64 per node: go left when x[feature] <= threshold
    left: np.ndarray  # int32 per node (-1 at a leaf)
    right: np.ndarray
    value: np.ndarray  # float64 per node (the leaf's contribution)
    roots: np.ndarray  # int32: each tree's first node
    baseline: float
    n_features: int

    def raw(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1] != self.n_features:
            raise ValueError(f"trees: {x.shape[1]} features given, the model was trained on {self.n_features}")
        t = self.layout
        return _raw(np.ascontiguousarray(x, np.float32), t.node, t.threshold, t.shift, t.value, t.roots, t.tree,
                    t.deeper, self.baseline)

    @cached_property
    def layout(self) -> Layout:
        return Layout.of(self)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """P(class 1) per row."""
        return 1.0 / (1.0 + np.exp(-self.raw(x)))

    def to_json(self) -> dict:
        return {"feature": self.feature.tolist(), "threshold": self.threshold.tolist(), "left": self.left.tolist(),
                "right": self.right.tolist(), "value": self.value.tolist(), "roots": self.roots.tolist(),
                "baseline": self.baseline, "n_features": self.n_features}

    @classmethod
    def from_json(cls, d: dict) -> "Trees":
        return cls(np.asarray(d["feature"], np.int32), np.asarray(d["threshold"], np.float64),
                   np.asarray(d["left"], np.int32), np.asarray(d["right"], np.int32),
                   np.asarray(d["value"], np.float64), np.asarray(d["roots"], np.int32), float(d["baseline"]),
                   int(d["n_features"]))


def export(model) -> Trees:
    """A fitted binary ``HistGradientBoostingClassifier`` as ``Trees``."""
    if getattr(model, "n_trees_per_iteration_", 1) != 1:
        raise ValueError("trees.export: a binary classifier is needed (one tree per iteration)")
    feats, thr, lefts, rights, vals, roots = [], [], [], [], [], []
    base = 0
    for (pred,) in model._predictors:
        nodes = pred.nodes
        if np.any(nodes["is_categorical"]):
            raise ValueError("trees.export: categorical splits are not supported")
        leaf = nodes["is_leaf"].astype(bool)
        roots.append(base)
        feats.append(np.where(leaf, -1, nodes["feature_idx"]).astype(np.int32))
        thr.append(nodes["num_threshold"].astype(np.float64))
        lefts.append(np.where(leaf, -1, nodes["left"] + base).astype(np.int32))
        rights.append(np.where(leaf, -1, nodes["right"] + base).astype(np.int32))
        vals.append(np.where(leaf, nodes["value"], 0.0).astype(np.float64))
        base += len(nodes)
    baseline = float(np.ravel(model._baseline_prediction)[0])
    return Trees(np.concatenate(feats), np.concatenate(thr), np.concatenate(lefts), np.concatenate(rights),
                 np.concatenate(vals), np.asarray(roots, np.int32), baseline, int(model.n_features_in_))
