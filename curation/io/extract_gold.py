"""Gold sets for extraction: pages with what their main text should be.

- ``aeb``: the article-extraction benchmark (181 news pages, gold ``articleBody``);
- ``trafilatura``: trafilatura's eval set (990 pages, ``with``/``without`` snippets);
- ``readability``: Mozilla readability's test pages (130, gold ``expected.html`` with its
  structure, ``lang`` from ``expected-metadata.json``);

read from the shared data folder (``$REFINERY_DATA``, else ``../shared/data`` beside the
checkout; its ``html/`` files, ``SHARED_FILES``), from any files laid out the same way (the
repository's fixtures), or a user's JSONL (``.gz``/``.xz``/``.zst``) of ``{"html": ..., "gold":
...}`` rows (gold text, or gold HTML when it starts with ``<``; optional ``id``, ``lang``).
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
#: the files each named set is read from, under the data folder
SHARED_FILES = {
    "aeb": ("html/article_extraction_benchmark_pages.tar.xz", "html/article_extraction_benchmark_ground-truth.json.gz"),
    "trafilatura": ("html/trafilatura_eval_and_cache_pages.tar.xz", "html/trafilatura_evaldata.json.gz"),
    "readability": ("html/mozilla_readability_test_pages.tar.xz",),
}


class GoldSetError(ValueError):
    """A gold set that cannot be read (a file missing, a row without html and gold)."""


@dataclass
class GoldPage:
    set: str
    name: str
    html: str
    text: str | None = None  # gold main text (word F1)
    gold_html: str | None = None  # gold main content as HTML (structure; its text for word F1)
    with_: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)
    lang: str | None = None  # from the gold's metadata, when it has one
    url: str | None = None


def shared_data() -> Path:
    """The shared data folder: ``$REFINERY_DATA``, else ``../shared/data`` beside the checkout."""
    env = os.environ.get("REFINERY_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _need(path: Path) -> Path:
    if not path.is_file():
        raise GoldSetError(f"{path}: gold set file not found (set REFINERY_DATA to the shared data folder, "
                           "the one holding html/)")
    return path


def _json_gz(path: Path) -> dict:
    return json.loads(gzip.decompress(_need(path).read_bytes()))


def aeb(pages_tar: Path, gold_json: Path) -> list[GoldPage]:
    """The article-extraction benchmark's pages (``<sha256>.html`` in a tar) with their gold
    ``articleBody`` (``ground-truth.json``, keyed by the hash); every gold key must have a page."""
    gold = _json_gz(gold_json)
    out = []
    with tarfile.open(_need(pages_tar)) as tf:
        for m in tf:
            key = Path(m.name).name.split(".")[0]
            if m.isfile() and m.name.endswith(".html") and key in gold:
                g = gold[key]
                out.append(GoldPage("aeb", key, decode_html(tf.extractfile(m).read(), None), text=g["articleBody"],
                                    url=g.get("url")))
    missing = set(gold) - {p.name for p in out}
    if missing:
        raise GoldSetError(f"{pages_tar}: no page for {len(missing)} gold entries of {gold_json} "
                           f"(e.g. {sorted(missing)[0]})")
    return sorted(out, key=lambda p: p.name)


def trafilatura(pages_tar: Path, evaldata_json: Path) -> list[GoldPage]:
    """trafilatura's eval pages (any folder of the tar, by file name) with their ``with`` and
    ``without`` snippets (``evaldata.json``, keyed by URL, ``file`` names the page)."""
    gold = _json_gz(evaldata_json)
    by_file = {g["file"]: (url, g) for url, g in gold.items()}
    out = []
    with tarfile.open(_need(pages_tar)) as tf:
        for m in tf:
            hit = by_file.get(Path(m.name).name)
            if m.isfile() and hit is not None:
                url, g = hit
                out.append(GoldPage("trafilatura", g["file"], decode_html(tf.extractfile(m).read(), None),
                                    with_=list(g.get("with") or []), without=list(g.get("without") or []), url=url))
    return sorted(out, key=lambda p: p.name)


def readability(pages_tar: Path) -> list[GoldPage]:
    """Mozilla readability's test pages: ``NAME/source.html`` with ``NAME/expected.html`` (the
    main content) and ``NAME/expected-metadata.json`` (its ``lang``)."""
    src: dict[str, str] = {}
    exp: dict[str, str] = {}
    meta: dict[str, dict] = {}
    with tarfile.open(_need(pages_tar)) as tf:
        for m in tf:
            if not m.isfile():
                continue
            name, leaf = Path(m.name).parent.name, Path(m.name).name
            if leaf in ("source.html", "expected.html"):
                (src if leaf == "source.html" else exp)[name] = decode_html(tf.extractfile(m).read(), None)
            elif leaf == "expected-metadata.json":
                meta[name] = json.loads(tf.extractfile(m).read())
    return [GoldPage("readability", k, src[k], gold_html=exp[k], lang=(meta.get(k) or {}).get("lang") or None)
            for k in sorted(src) if k in exp]


def user_jsonl(path: str | Path) -> list[GoldPage]:
    """A user's ``{"html", "gold"}`` rows (see module docstring); a bad row is an error naming it."""
    p = Path(path)
    out = []
    with open_text(p) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise GoldSetError(f"{path}:{i + 1}: not JSON ({e})") from None
            if not isinstance(r, dict) or not isinstance(r.get("html"), str) or not isinstance(r.get("gold"), str):
                raise GoldSetError(f"{path}:{i + 1}: a gold row needs string fields 'html' and 'gold'")
            gold = r["gold"]
            html_gold = gold.lstrip().startswith("<")
            out.append(GoldPage(p.name, str(r.get("id", i)), r["html"], text=None if html_gold else gold,
                                gold_html=gold if html_gold else None, lang=r.get("lang"), url=r.get("url")))
    if not out:
        raise GoldSetError(f"{path}: no gold rows")
    return out


def load(name: str, root: Path | None = None) -> list[GoldPage]:
    """One gold set by name (``GOLD_SETS``, from ``root`` or ``shared_data()``) or a JSONL path."""
    if name in GOLD_SETS:
        base = Path(root) if root is not None else shared_data()
        if not base.is_dir():
            raise GoldSetError(f"gold set {name!r}: data folder {base} not found "
                               "(set REFINERY_DATA to the shared data folder, the one holding html/)")
        return {"aeb": aeb, "trafilatura": trafilatura, "readability": readability}[name](
            *(base / f for f in SHARED_FILES[name]))
    if Path(name).is_file():
        return user_jsonl(name)
    raise GoldSetError(f"gold set {name!r}: neither one of {', '.join(GOLD_SETS)} nor a JSONL file")
