"""Training the block model on gold pages (``refinery extract train``).

Labels come from the gold text (``block_labels``): a block is main content when its words occur,
in order, in the gold's words; a short block (under 5 words) only together with a neighbour's
words, since alone "Home" or "Price" occurs in most gold texts. A long block mostly (80%) in
the gold counts too (the gold was cleaned of a stray word or two). A page with snippets instead of
a gold text (trafilatura's benchmark) labels only the blocks that hold one (``snippet_labels``).

Pass one is fitted on every page; pass two on pass one's out-of-fold scores (``folds`` groups of
pages by site, so a site's look-alike pages never score each other), the way it will see
scores of pages it was not trained on. Sample weights: the square root of a block's words
(word F1 is what is measured; a long paragraph should count more than a link, not 300x more).

``fit(..., cv=True)`` gives the honest figure: per page word F1 of out-of-fold decisions (pass
one and pass two both out of fold, with one leak: pass two's training scores come from pass-one
models that saw the held-out fold's pages).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence
from urllib.parse import urlparse

import numpy as np

from curation.extract.blocks import page_blocks
from curation.extract.main_content import BlockModel, keep_blocks, once, second_pass_features
from curation.extract.trees import export

_WORD = re.compile(r"\w+")
#: scikit-learn's settings for both passes (measured on WCXB dev, 5-fold by site)
PARAMS = dict(max_iter=150, learning_rate=0.1, max_leaf_nodes=31, min_samples_leaf=40, l2_regularization=1.0)
#: a snippet-labelled block's weight (``snippet_labels``): a snippet page labels ~6 of its ~190
#: blocks. Measured by 5-fold CV over WCXB, AEB, Mozilla's and trafilatura's pages together, with
#: this weight 0 / 1 / 3: trafilatura's segment F1 0.922 / 0.927 / 0.931, WCXB 0.862 / 0.861 / 0.861
SNIPPET_WEIGHT = 3.0


def block_labels(texts: Sequence[str], gold: str) -> np.ndarray:
    """1.0 per block that is main content by ``gold`` (module docstring), else 0.0."""
    gold_words = _WORD.findall(gold.lower())
    gk = " " + " ".join(gold_words) + " "
    gc = Counter(gold_words)
    toks = [_WORD.findall(t.lower()) for t in texts]
    out = np.zeros(len(texts), np.float32)
    if not gold_words:
        return out
    idx = [i for i, t in enumerate(toks) if t]
    for j, i in enumerate(idx):
        t = toks[i]
        key = " " + " ".join(t) + " "
        if len(t) >= 5:
            if key in gk:
                out[i] = 1.0
            elif len(t) >= 8 and sum((Counter(t) & gc).values()) >= 0.8 * len(t):
                out[i] = 1.0
            continue
        if key not in gk:
            continue
        prev = toks[idx[j - 1]] if j > 0 else None
        nxt = toks[idx[j + 1]] if j + 1 < len(idx) else None
        if (prev is not None and " " + " ".join(prev[-4:] + t) + " " in gk) or \
                (nxt is not None and " " + " ".join(t + nxt[:4]) + " " in gk):
            out[i] = 1.0
    return out


def snippet_labels(texts: Sequence[str], with_: Sequence[str], without: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Labels and label weights from a page's snippets instead of a gold text (trafilatura's
    benchmark: a few sentences that must be in the main text, a few that must not): a block
    holding a must-have snippet is content, one holding a boilerplate snippet is not, and every
    other block is unlabelled (weight 0; it still gives pass two its scores around the labelled
    ones). A snippet spread over two blocks labels neither."""
    flat = [" ".join(t.split()) for t in texts]
    y = np.zeros(len(texts), np.float32)
    w = np.zeros(len(texts), np.float32)
    for snippets, label in ((without, 0.0), (with_, 1.0)):
        for sn in snippets:
            sn = " ".join(sn.split())
            if sn:
                for i, t in enumerate(flat):
                    if sn in t:
                        y[i], w[i] = label, 1.0
    return y, w


@dataclass
class Dataset:
    """Every gold page's blocks: features, labels and their weights (0: unlabelled), grouping ids,
    texts; which page each is."""

    x: list[np.ndarray]
    y: list[np.ndarray]
    groups: list[np.ndarray]
    texts: list[list[str]]
    sites: np.ndarray  # a site id per page (folds keep a site together)
    labelled: list[np.ndarray]  # each block's label weight: 1, SNIPPET_WEIGHT, or 0 where no label is known

    def weights(self) -> list[np.ndarray]:
        """Per block sample weights: the square root of its words (module docstring), times its label's weight."""
        return [np.sqrt(x[:, 0]) * m for x, m in zip(self.x, self.labelled)]


def dataset(pages: Sequence, progress: Callable[[int], None] | None = None) -> Dataset:
    """Blocks and labels of gold pages (``curation.extract.gold.GoldPage`` with a gold text, or
    else with snippets: ``snippet_labels``)."""
    xs, ys, gs, ts, sites, ms = [], [], [], [], [], []
    site_ids: dict[str, int] = {}
    for k, p in enumerate(pages):
        if p.text is None and not (p.with_ or p.without):
            continue
        pg = page_blocks(p.html)
        xs.append(pg.features)
        if p.text is not None:
            ys.append(block_labels(pg.texts, p.text))
            ms.append(np.ones(len(pg.texts), np.float32))
        else:
            y, m = snippet_labels(pg.texts, p.with_, p.without)
            ys.append(y)
            ms.append(m * SNIPPET_WEIGHT)
        gs.append(pg.groups)
        ts.append(pg.texts)
        # a page without an address goes with its name's first word: Mozilla's test pages
        # "cnet" and "cnet-svg-classes" are one site's, and a fold must not split them
        host = urlparse(p.url or "").netloc.removeprefix("www.") or f"{p.set}/{re.split(r'[-_.]', p.name)[0]}"
        sites.append(site_ids.setdefault(host, len(site_ids)))
        if progress and k % 100 == 0:
            progress(k)
    return Dataset(xs, ys, gs, ts, np.asarray(sites), ms)


def _fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, seed: int):
    from sklearn.ensemble import HistGradientBoostingClassifier

    known = w > 0  # unlabelled blocks (snippet pages) only feed pass two's neighbour scores
    x, y, w = x[known], y[known], w[known]
    if len(np.unique(y)) < 2:
        raise ValueError("extract train: the gold pages' blocks are all one class (no main content found in "
                         "their HTML, or nothing else); give pages whose gold text occurs in their HTML")
    return HistGradientBoostingClassifier(**PARAMS, random_state=seed).fit(x, y, sample_weight=w)


def _folds(ds: Dataset, k: int, seed: int) -> list[np.ndarray]:
    """Pages split into ``k`` folds by site (a page index array per fold)."""
    rng = np.random.default_rng(seed)
    site_fold = rng.permutation(ds.sites.max() + 1) % k
    fold = site_fold[ds.sites]
    return [np.flatnonzero(fold == f) for f in range(k)]


def _stack(parts: list[np.ndarray], pages: np.ndarray) -> np.ndarray:
    return np.concatenate([parts[i] for i in pages]) if len(pages) else np.zeros((0,))


def _out_of_fold_first(ds: Dataset, folds: list[np.ndarray], seed: int) -> list[np.ndarray]:
    """Pass one's score of every block from a model that did not see its page's fold."""
    scores: list[np.ndarray] = [np.zeros(0)] * len(ds.x)
    everything = np.arange(len(ds.x))
    weights = ds.weights()
    for test in folds:
        train = np.setdiff1d(everything, test)
        m = export(_fit(_stack(ds.x, train), _stack(ds.y, train), _stack(weights, train), seed))
        for i in test:
            scores[i] = m.predict(ds.x[i]) if len(ds.x[i]) else np.zeros(0)
    return scores


def fit(ds: Dataset, folds: int = 5, seed: int = 0, threshold: float = 0.5,
        cv: bool = False) -> tuple[BlockModel, list[np.ndarray] | None]:
    """The two passes on every page of ``ds`` (module docstring), and with ``cv`` pass two's
    out-of-fold score of every block (the same folds: pass one's out-of-fold scores serve both)."""
    split = _folds(ds, folds, seed)
    everything = np.arange(len(ds.x))
    weights = ds.weights()
    p1 = _out_of_fold_first(ds, split, seed)
    x2 = [second_pass_features(x, p, g) if len(x) else np.zeros((0, 0), np.float32)
          for x, p, g in zip(ds.x, p1, ds.groups)]
    texted = np.array([i for i in everything if len(ds.x[i])])
    oof = None
    if cv:
        oof = [np.zeros(0)] * len(ds.x)
        for test in split:
            train = np.intersect1d(np.setdiff1d(everything, test), texted)
            m = export(_fit(_stack(x2, train), _stack(ds.y, train), _stack(weights, train), seed))
            for i in test:
                oof[i] = m.predict(x2[i]) if len(ds.x[i]) else np.zeros(0)
    first = export(_fit(_stack(ds.x, texted), _stack(ds.y, texted), _stack(weights, texted), seed))
    second = export(_fit(_stack(x2, texted), _stack(ds.y, texted), _stack(weights, texted), seed))
    return BlockModel(first, second, threshold), oof


def decide(texts: list[str], scores: np.ndarray, features: np.ndarray, groups: np.ndarray, floor: float) -> str:
    """The text ``extract_blocks`` writes for these block scores (kept blocks, one a line; data
    tables aside)."""
    keep = once(texts, keep_blocks(scores, features[:, 0], floor), features, groups)
    return "\n".join(t for t, k in zip(texts, keep) if k)


def train_from_gold(gold: Sequence[str], out: str, folds: int = 5, cv: bool = False, seed: int = 0,
                    limit: int | None = None, log: Callable[[str], None] = print) -> dict:
    """``refinery extract train``: the block model fitted on gold sets (names of
    ``curation.extract.gold`` or ``{html, gold}`` JSONL files), written to ``out``; with ``cv``
    the out-of-fold word F1 per gold set and page type first (the honest figure). Returns the
    model card (also stored in the model file as ``trained_on``)."""
    from curation.extract.gold import load
    from curation.extract.scores import gold_structure, segment_prf, snippet_rates, word_prf

    pages = [p for g in gold for p in load(g)[:limit]
             if p.text is not None or p.gold_html is not None or p.with_ or p.without]
    for p in pages:
        if p.text is None and p.gold_html is not None:  # gold HTML: its text
            p.text = gold_structure(p.gold_html).text
    if len(pages) < max(folds, 2):
        raise ValueError(f"extract train: {len(pages)} gold pages with a gold text or snippets; "
                         f"need at least {max(folds, 2)}")
    log(f"blocks of {len(pages)} gold pages ...")
    ds = dataset(pages)
    labelled = np.concatenate(ds.labelled)  # the content share of the labelled blocks only
    card: dict = {"gold": list(gold), "pages": len(pages), "blocks": int(sum(len(y) for y in ds.y)),
                  "content_share": float(np.concatenate(ds.y) @ labelled / max(float(labelled.sum()), 1.0)),
                  "folds": folds, "seed": seed, "params": PARAMS}
    log(f"fitting both passes ({folds}-fold out-of-fold scores for pass two"
        f"{', and its cross-validation' if cv else ''}) ...")
    model, oof = fit(ds, folds, seed, cv=cv)
    if oof is not None:
        by: dict[str, list[float]] = {}
        empty: dict[str, int] = {}
        per_page = []
        segments: dict[str, list[int]] = {}
        for p, texts, s, x, g in zip(pages, ds.texts, oof, ds.x, ds.groups):
            text = decide(texts, s, x, g, model.floor) if texts else ""
            if p.text is None:  # a snippet page: trafilatura's segment score, summed over the set
                rates = snippet_rates(text, p.with_, p.without)
                segments[p.set] = [a + b for a, b in zip(segments.get(p.set, [0, 0, 0, 0]), rates)]
                continue
            prec, rec, f1 = word_prf(text, p.text, p.scoring)
            per_page.append((f1, prec, rec, p.set, p.name, p.page_type, p.url))
            for key in (p.set, f"{p.set}:{p.page_type}" if p.page_type else None):
                if key:
                    by.setdefault(key, []).append(f1)
                    empty[key] = empty.get(key, 0) + (not text.split() and bool(p.text.split()))
        card["cv_word_f1"] = {k: round(float(np.mean(v)), 4) for k, v in by.items()}
        card["cv_pages"] = {k: len(v) for k, v in by.items()}
        card["cv_empty"] = empty
        card["cv_segment"] = {k: {m: round(v, 4) for m, v in segment_prf(*r).items()} for k, r in segments.items()}
        card["cv_worst"] = [{"f1": round(f, 3), "precision": round(pr, 3), "recall": round(rc, 3), "set": st,
                             "page": name, "type": kind, "url": url}
                            for f, pr, rc, st, name, kind, url in sorted(per_page, key=lambda r: r[:2])[:20]]
    model.trained_on = card
    model.save(out)
    return card
