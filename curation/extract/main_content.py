"""The main-content decision: which blocks of a page are its main content, by a two-pass model.

Pass one scores each block from what the page says about it (``blocks.FEATURES``: its words
and link words, tag, depth, position, class/id words of it and its ancestors, how much text
its parent and grandparents hold, the page's totals). Pass two scores it again with pass one's
scores around it: its neighbours', its siblings' and cousins' (blocks under the same parent,
grandparent, great-grandparent; word-weighted), the page's share of content words. A product
grid or a forum thread is many small blocks that only look like content together; pass two is
where they are seen together.

Both passes are gradient-boosted trees (``trees.Trees``) trained by the project on gold pages
(``curation.extract.train``, ``refinery extract train``), shipped as ``models/blocks.json``.
Which blocks are kept is decided per page from pass two's scores (``keep_blocks``): the set that
maximizes the page's expected word F1, which is every block scoring above half that expected F1
(a page whose blocks are all uncertain keeps more of them than a page with one sure article);
a block under ``floor`` is never kept. A text the page repeats is kept once (``once``).

``extract_blocks(html, format)``: the main content as text (kept blocks, one a line) or
Markdown (the tree pruned to the kept blocks, then the Markdown writer with main-content
detection off). A page with no text in its body gives its ``<meta>`` description (pages
rendered by script, whose only words a crawler sees are there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from curation.extract.blocks import FEATURES, Page, page_blocks, prune
from curation.extract.trees import Trees

MODEL_PATH = Path(__file__).with_name("models") / "blocks.json"
#: the columns pass two adds to pass one's features
SECOND_PASS = ("p", "p_prev", "p_next", "p_window2", "p_window5", "p_parent", "p_grand", "p_great",
               "log_parent_blocks", "log_great_blocks", "p_page", "page_content_share", "p_page_max", "p_rank")


class ModelError(ValueError):
    """A block model file that cannot be used (missing, another feature set)."""


@dataclass
class BlockModel:
    first: Trees
    second: Trees
    threshold: float = 0.5  # data tables are decided against it (``whole_tables``)
    floor: float = 0.2  # no block scoring under it is kept (``keep_blocks``)
    features: tuple[str, ...] = FEATURES
    trained_on: dict | None = None  # what the training said about itself (sets, pages, CV figures)

    def to_json(self) -> dict:
        return {"kind": "refinery.block_model", "version": 2, "features": list(self.features),
                "second_pass": list(SECOND_PASS), "threshold": self.threshold, "floor": self.floor,
                "first": self.first.to_json(),
                "second": self.second.to_json(), "trained_on": self.trained_on}

    @classmethod
    def from_json(cls, d: dict, source: str = "model") -> "BlockModel":
        if d.get("kind") != "refinery.block_model":
            raise ModelError(f"{source}: not a refinery block model (kind {d.get('kind')!r})")
        if tuple(d["features"]) != FEATURES or tuple(d["second_pass"]) != SECOND_PASS:
            raise ModelError(f"{source}: trained on another feature set than this version computes; "
                             "retrain it with `refinery extract train`")
        return cls(Trees.from_json(d["first"]), Trees.from_json(d["second"]), float(d["threshold"]),
                   float(d.get("floor", 0.2)), tuple(d["features"]), d.get("trained_on"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    def scores(self, page: Page) -> np.ndarray:
        """Pass two's score per block of ``page``."""
        if not len(page.texts):
            return np.zeros(0)
        p1 = self.first.predict(page.features)
        return self.second.predict(second_pass_features(page.features, p1, page.groups))


def keep_blocks(scores: np.ndarray, words: np.ndarray, floor: float) -> np.ndarray:
    """Which blocks to keep (a bool each): those that maximize the page's expected word F1 when
    block ``i``'s words are main content with probability ``scores[i]``, independently.

    Expected F1 of a kept set K is about ``2 * sum_K(p*w) / (sum_K(w) + sum_all(p*w))``, a ratio
    whose best K keeps every block with ``p`` above half the best value (Dinkelbach): a prefix of
    the blocks by score, found in one pass over the cumulative sums."""
    keep = np.zeros(len(scores), np.bool_)
    if not len(scores):
        return keep
    p = np.asarray(scores, np.float64)
    w = np.asarray(words, np.float64)
    order = np.argsort(-p, kind="stable")
    gain = np.cumsum((p * w)[order])
    f1 = 2 * gain / np.maximum(np.cumsum(w[order]) + gain[-1], 1e-9)
    keep[order[:int(np.argmax(f1)) + 1]] = True
    return keep & (p >= floor)


@lru_cache(maxsize=8)
def load_model(path: str | None = None) -> BlockModel:
    """The shipped model, or the one at ``path`` (a file ``refinery extract train`` wrote)."""
    p = Path(path) if path else MODEL_PATH
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise ModelError(f"block model {p} not found") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"block model {p}: not JSON ({e})") from None
    return BlockModel.from_json(d, str(p))


def _pool(p: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word-weighted mean of ``p`` over the blocks sharing each group id, and the group's size."""
    _, inv = np.unique(g, return_inverse=True)
    num = np.bincount(inv, weights=p * w)
    den = np.bincount(inv, weights=w)
    return (num / np.maximum(den, 1e-9))[inv], np.bincount(inv)[inv]


def second_pass_features(x: np.ndarray, p: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Pass one's features with ``SECOND_PASS`` columns from its scores ``p`` appended."""
    n = len(p)
    w = x[:, 0].astype(np.float64)  # words
    pad = np.concatenate([[0.5], p, [0.5]])
    cw = np.concatenate([[0.0], np.cumsum(p * w)])
    cc = np.concatenate([[0.0], np.cumsum(w)])
    at = np.arange(n)

    def window(k: int) -> np.ndarray:
        lo, hi = np.clip(at - k, 0, n), np.clip(at + k + 1, 0, n)
        return (cw[hi] - cw[lo]) / np.maximum(cc[hi] - cc[lo], 1e-9)

    g1, c1 = _pool(p, w, groups[:, 0])
    g2, _ = _pool(p, w, groups[:, 1])
    g3, c3 = _pool(p, w, groups[:, 2])
    total = max(w.sum(), 1e-9)
    extra = np.stack([p, pad[:-2], pad[2:], window(2), window(5), g1, g2, g3, np.log1p(c1), np.log1p(c3),
                      np.full(n, (p * w).sum() / total), np.full(n, (w * (p > 0.5)).sum() / total),
                      np.full(n, p.max()), np.argsort(np.argsort(-p)) / n], 1)
    return np.concatenate([x, extra], 1).astype(np.float32)


def meta_description(root) -> str:
    """The page's ``og:description`` or ``description`` meta content ('' when none)."""
    if root is None:
        return ""
    best = ""
    for m in root.iterfind(".//meta"):
        name = (m.get("name") or m.get("property") or "").lower()
        if name in ("description", "og:description", "twitter:description"):
            c = " ".join((m.get("content") or "").split())
            if len(c) > len(best):
                best = c
    return best


#: a table whose cells are at least this many, of at most this many words on average, is data:
#: kept or dropped whole (a row missing a cell is no row); a layout table's cells are long.
#: Kept at this share of the block threshold: a data table's cells score lower than prose around
#: them (on Mozilla's pages: data tables 0.34-0.57, log-in and menu tables 0.03-0.17)
DATA_TABLE_CELLS, DATA_TABLE_CELL_WORDS, DATA_TABLE_SHARE = 4, 15, 0.6


def whole_tables(page: Page, scores: np.ndarray, keep: np.ndarray, threshold: float) -> np.ndarray:
    """``keep`` with each data table's cells decided together: kept when their word-weighted
    mean score reaches ``DATA_TABLE_SHARE * threshold``, else dropped (a block model judges cells
    one by one, and a row of numbers loses its short cells)."""
    cells = page.cells
    if not len(cells) or not cells.any():
        return keep
    keep = keep.copy()
    words = page.features[:, 0].astype(np.float64)
    for table in np.unique(cells[cells != 0]):
        at = cells == table
        if at.sum() >= DATA_TABLE_CELLS and words[at].mean() <= DATA_TABLE_CELL_WORDS:
            keep[at] = (scores[at] * words[at]).sum() / words[at].sum() >= DATA_TABLE_SHARE * threshold
    return keep


#: a block that repeats by nature: a code line ("},") or a table cell ("true")
_BY_NATURE = (FEATURES.index("in_pre"), FEATURES.index("in_table"))
_REPEATS = FEATURES.index("repeats")


def once(texts: list[str], keep: np.ndarray, features: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``keep`` with a kept text that the page repeats kept at its first place only: a reply's
    quote of an earlier post, a description in both a mobile and a desktop tab. Not where the
    repeat is a sibling of the first (a list of like items is the list's content), nor in code or
    tables (a "}," line or a "true" cell repeats by nature). Out of fold on WCXB 0.860 -> 0.868
    (forum 0.781 -> 0.806, product 0.671 -> 0.688); dropping every repeat lost Mozilla's test pages,
    whose gold repeats a paragraph, 0.927 -> 0.893, and documentation's code 0.937 -> 0.929."""
    keep = keep.copy()
    repeated = np.flatnonzero(keep & (features[:, _REPEATS] > 0))  # the walk counted each text's twins
    if not len(repeated):
        return keep
    parents = groups[:, 0]
    nature = (features[:, _BY_NATURE] > 0).any(1)
    first: dict[str, int] = {}
    for j in repeated.tolist():
        f = first.setdefault(texts[j], j)
        if f != j and parents[j] != parents[f] and not nature[j]:
            keep[j] = False
    return keep


def extract_blocks(html: str, format: str = "text", model: BlockModel | None = None,
                   markdown_options: dict | None = None) -> str:
    """One decoded page -> its main content (module docstring). ``markdown_options``: the
    Markdown writer's resiliparse options (main-content detection is turned off: the blocks
    are decided here)."""
    page = page_blocks(html)
    if not page.texts:
        return meta_description(page.root)
    model = model or load_model()
    scores = model.scores(page)
    keep = whole_tables(page, scores, keep_blocks(scores, page.features[:, 0], model.floor), model.threshold)
    keep = once(page.texts, keep, page.features, page.groups)
    if format == "markdown":
        return _markdown(page, keep, markdown_options or {})
    return "\n".join(t for t, k in zip(page.texts, keep) if k)


def _markdown(page: Page, keep: np.ndarray, options: dict) -> str:
    from lxml import etree

    from curation.extract.markdown import resiliparse_markdown

    if not keep.any():
        return ""
    prune(page, keep)
    html = etree.tostring(page.root, encoding="unicode", method="html")
    return resiliparse_markdown(html, {**options, "main_content": False})
