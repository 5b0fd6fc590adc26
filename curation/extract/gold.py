r"""Gold sets for extraction: pages with what their main text should be.

- ``aeb``: the article-extraction benchmark (181 news pages, gold ``articleBody``);
- ``trafilatura``: trafilatura's eval set (990 pages, ``with``/``without`` snippets);
- ``readability``: Mozilla readability's test pages (130, gold ``expected.html`` with its
  structure, ``lang`` from ``expected-metadata.json``);
- ``wcxb``: WCXB's development split (1,497 pages of 7 labelled types: article, forum, product,
  collection, listing, documentation, service; gold ``main_content``, ``with``/``without``
  snippets), scored the benchmark's way (``GoldPage.scoring``: lowercased ``\w+`` words);

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
from curation.extract.engines import decode_html

GOLD_SETS = ("aeb", "trafilatura", "readability", "wcxb")
#: the files each named set is read from, under the data folder
SHARED_FILES = {
    "aeb": ("html/article_extraction_benchmark_pages.tar.xz", "html/article_extraction_benchmark_ground-truth.json.gz"),
    "trafilatura": ("html/trafilatura_eval_and_cache_pages.tar.xz", "html/trafilatura_evaldata.json.gz"),
    "readability": ("html/mozilla_readability_test_pages.tar.xz",),
    "wcxb": ("html/wcxb_dev.tar",),
}
#: WCXB's page types (its metadata says ``category`` for a collection)
WCXB_TYPES = ("article", "forum", "product", "collection", "listing", "documentation", "service")


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
    page_type: str | None = None  # the set's own label (WCXB), else derived by the eval
    scoring: str = "whitespace"  # word F1's tokens: "whitespace" (AEB's way) or "wcxb" (lowercased \w+)
    gold_markdown: str | None = None  # the gold main content as Markdown (WCXB)


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


def wcxb(tar_path: Path) -> list[GoldPage]:
    """WCXB's dev split: ``*/dev/html/ID.html.gz`` with ``*/dev/ground-truth/ID.json`` (``url``,
    ``ground_truth.main_content`` / ``main_content_markdown`` / ``with`` / ``without``,
    ``_internal.page_type.primary``) in one plain tar; every gold file must have its page."""
    html: dict[str, bytes] = {}
    gold: dict[str, dict] = {}
    with tarfile.open(_need(tar_path)) as tf:
        for m in tf:
            if not m.isfile():
                continue
            parts = Path(m.name).parts
            if "html" in parts and m.name.endswith(".html.gz"):
                html[Path(m.name).name.split(".")[0]] = gzip.decompress(tf.extractfile(m).read())
            elif "ground-truth" in parts and m.name.endswith(".json"):
                gold[Path(m.name).stem] = json.loads(tf.extractfile(m).read())
    missing = sorted(set(gold) - set(html))
    if missing or not gold:
        raise GoldSetError(f"{tar_path}: " + (f"no page for {len(missing)} gold files (e.g. {missing[0]})" if missing
                                              else "no WCXB ground-truth files in it"))
    out = []
    for key in sorted(gold):
        g, meta = gold[key].get("ground_truth") or {}, gold[key].get("_internal") or {}
        kind = ((meta.get("page_type") or {}).get("primary") or "?").lower()
        out.append(GoldPage("wcxb", key, decode_html(html[key], None), text=g.get("main_content") or "",
                            with_=list(g.get("with") or []), without=list(g.get("without") or []),
                            url=gold[key].get("url"), page_type="collection" if kind == "category" else kind,
                            scoring="wcxb", gold_markdown=g.get("main_content_markdown")))
    return out


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
                                gold_html=gold if html_gold else None, lang=r.get("lang"), url=r.get("url"),
                                page_type=r.get("page_type") if isinstance(r.get("page_type"), str) else None))
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
        return {"aeb": aeb, "trafilatura": trafilatura, "readability": readability, "wcxb": wcxb}[name](
            *(base / f for f in SHARED_FILES[name]))
    if Path(name).is_file():
        return user_jsonl(name)
    raise GoldSetError(f"gold set {name!r}: neither one of {', '.join(GOLD_SETS)} nor a JSONL file")
