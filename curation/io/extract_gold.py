"""Gold sets for extraction: pages with what their main text should be.

``aeb`` (the article-extraction benchmark: 181 pages, gold ``articleBody``), ``trafilatura``
(trafilatura's eval set: 990 pages, ``with``/``without`` snippets), ``readability`` (Mozilla
readability's 130 test pages, gold ``expected.html`` with structure), from the shared data
folder (``$REFINERY_DATA``, else ``../shared/data`` beside the checkout), or a user's JSONL
of ``{"html": ..., "gold": ...}`` rows (gold text, or gold HTML when it starts with ``<``).
"""

from __future__ import annotations

import gzip
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from curation.io.evalsets import open_text
from curation.text.extraction import decode_html

GOLD_SETS = ("aeb", "trafilatura", "readability")


@dataclass
class GoldPage:
    set: str
    name: str
    html: str
    text: str | None = None  # gold main text (word F1)
    gold_html: str | None = None  # gold main content as HTML (structure; its text for word F1)
    with_: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)


def shared_data() -> Path:
    env = os.environ.get("REFINERY_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path}: gold set file not found (set REFINERY_DATA to the shared data folder)")
    return path


def aeb(root: Path) -> list[GoldPage]:
    html_dir = root / "html"
    gold = json.loads(gzip.decompress(_need(html_dir / "article_extraction_benchmark_ground-truth.json.gz").read_bytes()))
    out = []
    with tarfile.open(_need(html_dir / "article_extraction_benchmark_pages.tar.xz")) as tf:
        for m in tf:
            key = Path(m.name).name.split(".")[0]
            if m.isfile() and m.name.endswith(".html") and key in gold:
                out.append(GoldPage("aeb", key, decode_html(tf.extractfile(m).read(), None), text=gold[key]["articleBody"]))
    return sorted(out, key=lambda p: p.name)


def trafilatura(root: Path) -> list[GoldPage]:
    html_dir = root / "html"
    gold = json.loads(gzip.decompress(_need(html_dir / "trafilatura_evaldata.json.gz").read_bytes()))
    by_file = {g["file"]: g for g in gold.values()}
    out = []
    with tarfile.open(_need(html_dir / "trafilatura_eval_and_cache_pages.tar.xz")) as tf:
        for m in tf:
            g = by_file.get(Path(m.name).name)
            if m.isfile() and g is not None:
                out.append(GoldPage("trafilatura", g["file"], decode_html(tf.extractfile(m).read(), None),
                                    with_=list(g.get("with") or []), without=list(g.get("without") or [])))
    return sorted(out, key=lambda p: p.name)


def readability(root: Path) -> list[GoldPage]:
    src: dict[str, str] = {}
    exp: dict[str, str] = {}
    with tarfile.open(_need(root / "html" / "mozilla_readability_test_pages.tar.xz")) as tf:
        for m in tf:
            if m.isfile() and m.name.endswith(("/source.html", "/expected.html")):
                d = src if m.name.endswith("source.html") else exp
                d[Path(m.name).parent.name] = decode_html(tf.extractfile(m).read(), None)
    return [GoldPage("readability", k, src[k], gold_html=exp[k]) for k in sorted(src) if k in exp]


def user_jsonl(path: str) -> list[GoldPage]:
    out = []
    with open_text(Path(path)) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            r = json.loads(line)
            if not isinstance(r.get("html"), str) or not isinstance(r.get("gold"), str):
                raise ValueError(f"{path}:{i + 1}: a gold row needs string fields 'html' and 'gold'")
            gold = r["gold"]
            html_gold = gold.lstrip().startswith("<")
            out.append(GoldPage(Path(path).name, str(r.get("id", i)), r["html"], text=None if html_gold else gold,
                                gold_html=gold if html_gold else None))
    return out


def load(name: str, root: Path | None = None) -> list[GoldPage]:
    """One gold set by name (``GOLD_SETS``) or a JSONL path."""
    root = root or shared_data()
    if name in GOLD_SETS:
        return {"aeb": aeb, "trafilatura": trafilatura, "readability": readability}[name](root)
    if Path(name).is_file():
        return user_jsonl(name)
    raise ValueError(f"gold set {name!r}: neither one of {', '.join(GOLD_SETS)} nor a JSONL file")
