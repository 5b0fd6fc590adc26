"""Rebuild ``docs.jsonl.gz`` (the real documents of tests/test_toolbox_stages.py) from the team's
shared data folder (``../shared/data``, see its README). Run from the repo root:

    .venv/bin/python tests/data/toolbox/make_fixture.py [SHARED_DATA]

Every document is real text, unchanged (the tests build mojibake and other variants from
them at test time). Fields: ``id``, ``url`` (null where the origin has none), ``text``,
``source``, ``origin`` (file and position in the shared data).
"""

from __future__ import annotations

import gzip
import json
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[3] / "shared" / "data"

#: article-extraction-benchmark ground truth, by position in ground-truth.json: pages with
#: e-mail addresses (11, 107, 119, 149), with English bad words (18, 76, 141, 165), symbol-only
#: lines (122), other English pages (41, 43, 65, 96, 153),
#: pages in German (128), Russian (143), Japanese (93)
AEB_PICK = [11, 107, 119, 149, 18, 76, 141, 165, 122, 41, 43, 65, 96, 153, 128, 143, 93]
#: trafilatura eval pages (extracted with resiliparse, main content), with IP addresses
TRAFILATURA_PICK = ["netbits.us.stunnel_rsync.html", "nmb-media.de.ebay.html", "antary.de.wireshark.html",
                    "d43f330cbaf74e92b9aec85e937cb904.html"]
#: DCLM Common Crawl pages (no URL in the file) with e-mail addresses, by line number
DCLM_PICK = [28, 82, 276]
#: lingua test sentences: (language, first line, lines), joined by spaces into one document
LINGUA_PICK = [("de", 700, 8), ("de", 10, 8), ("ru", 50, 8), ("ru", 10, 8), ("ja", 125, 6), ("ja", 10, 6)]


def aeb_docs() -> list[dict]:
    with gzip.open(SHARED / "html" / "article_extraction_benchmark_ground-truth.json.gz", "rt") as f:
        items = list(json.load(f).items())
    return [{"id": f"aeb-{i}", "url": items[i][1]["url"], "text": items[i][1]["articleBody"], "source": "news",
             "origin": f"html/article_extraction_benchmark_ground-truth.json.gz [{i}] {items[i][0]}"}
            for i in AEB_PICK]


def trafilatura_docs() -> list[dict]:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    with gzip.open(SHARED / "html" / "trafilatura_evaldata.json.gz", "rt") as f:
        urls = {v["file"]: k for k, v in json.load(f).items() if v.get("file")}
    out = {}
    with tarfile.open(SHARED / "html" / "trafilatura_eval_and_cache_pages.tar.xz") as tf:
        for m in tf:
            name = m.name.rsplit("/", 1)[-1]
            if name in TRAFILATURA_PICK:
                raw = tf.extractfile(m).read()
                text = extract_plain_text(bytes_to_str(raw, detect_encoding(raw)), main_content=True)
                out[name] = {"id": f"traf-{name.removesuffix('.html')}", "url": urls[name], "text": text,
                             "source": "web", "origin": f"html/trafilatura_eval_and_cache_pages.tar.xz : {m.name}"}
    return [out[n] for n in TRAFILATURA_PICK]


def ewt_doc() -> dict:
    """The English Web Treebank e-mail that links to a photo album by IP address."""
    sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
    from real_corpus import ud_ewt_documents

    docs = ud_ewt_documents(SHARED / "text" / "ud_english_ewt-test.conllu.xz")
    i = next(i for i, d in enumerate(docs) if "24.27.98.30" in d)
    return {"id": "ewt-ip", "url": None, "text": docs[i], "source": "web",
            "origin": f"text/ud_english_ewt-test.conllu.xz document {i} (# text lines joined)"}


def dclm_docs() -> list[dict]:
    with gzip.open(SHARED / "jsonl" / "dclm_majority_data.jsonl.gz", "rt") as f:
        lines = f.readlines()
    return [{"id": f"dclm-{i}", "url": None, "text": json.loads(lines[i])["text"], "source": "web",
             "origin": f"jsonl/dclm_majority_data.jsonl.gz line {i} (0-based)"} for i in DCLM_PICK]


def lingua_docs() -> list[dict]:
    out = []
    with tarfile.open(SHARED / "text" / "lingua_language_testdata_sentences.tar.xz") as tf:
        files = {m.name.rsplit("/", 1)[-1].split(".")[0]: m for m in tf if m.isfile()}
        for lang, start, n in LINGUA_PICK:
            lines = tf.extractfile(files[lang]).read().decode("utf-8").splitlines()
            sep = "" if lang == "ja" else " "
            out.append({"id": f"lingua-{lang}-{start}", "url": None, "text": sep.join(lines[start:start + n]),
                        "source": "web", "lang": lang,
                        "origin": f"text/lingua_language_testdata_sentences.tar.xz : {files[lang].name} "
                                  f"lines {start}-{start + n - 1}"})
    return out


def main() -> None:
    docs = aeb_docs() + trafilatura_docs() + [ewt_doc()] + dclm_docs() + lingua_docs()
    with gzip.GzipFile(HERE / "docs.jsonl.gz", "wb", mtime=0) as f:
        for d in docs:
            f.write((json.dumps(d, ensure_ascii=False) + "\n").encode("utf-8"))
    print(f"{len(docs)} documents, {sum(len(d['text']) for d in docs):,} characters")


if __name__ == "__main__":
    main()
