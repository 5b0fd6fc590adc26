"""Gradient-boosted trees as arrays: trained by scikit-learn, shipped as JSON, scored by numba.

``export(model)`` turns a fitted ``HistGradientBoostingClassifier`` (binary) into a ``Trees``
(flat node arrays: feature, threshold, left, right, leaf value; one root index per tree);
``Trees.predict(x)`` gives the same probabilities as ``model.predict_proba(x)[:, 1]`` (tested
against it) without scikit-learn's per-call checks, which cost more than the trees on a page's
few hundred blocks. Features never hold NaN here, so the missing-value branch is not stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _raw(x, feature, threshold, left, right, value, roots, baseline):  # pragma: no cover (compiled)
    n = x.shape[0]
    out = np.full(n, baseline)
    for i in range(n):
        s = 0.0
        for r in roots:
            j = r
            while left[j] >= 0:
                j = left[j] if x[i, feature[j]] <= threshold[j] else right[j]
            s += value[j]
        out[i] += s
    return out


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
        return _raw(np.ascontiguousarray(x, np.float32), self.feature, self.threshold, self.left, self.right,
                    self.value, self.roots, self.baseline)

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
