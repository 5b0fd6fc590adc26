"""Rebuild ``pages.jsonl.gz`` from the team's shared data (run by hand, from the repository root):

    .venv/bin/python tests/data/lang_rules/make_pages.py

Each page: its HTML from a shared tarball, text by resiliparse with the ``extract`` stage's
settings, ``lang`` by CLD2 (the ``langid`` stage). Chosen by name (``PAGES``), not by score
beyond what the tests need: German, French, Spanish and Polish news pages that Gopher's
English stop-word rule drops, English pages (kept and dropped), Chinese and Japanese news.
"""

from __future__ import annotations

import gzip
import json
import sys
import tarfile
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from real_corpus import SHARED_DATA  # noqa: E402

from curation.extract.engines import _resiliparse, decode_html  # noqa: E402
from curation.stages.langid import LanguageId  # noqa: E402

TRAF = "trafilatura_eval_and_cache_pages.tar.xz"
PAGES = [
    (TRAF, "trafilatura/eval/kochbar.de.schneiden.html"),
    (TRAF, "trafilatura/eval/KATAPULT-Magazin.de-parteien.html"),
    (TRAF, "trafilatura/eval/it-learner.de.autotuning.html"),
    (TRAF, "trafilatura/eval/gala.fr.surnom.html"),
    (TRAF, "trafilatura/eval/ledevoir.com.trottinettes.html"),
    (TRAF, "trafilatura/eval/elenacional.com-carta.html"),
    (TRAF, "trafilatura/eval/Windows 10 od lipca przestanie obsługiwać Adobe Flash.html"),
    (TRAF, "trafilatura/cache/knowtechie.com.rally.html"),
    (TRAF, "trafilatura/cache/luxuriousmagazine.com.polo.html"),
    (TRAF, "trafilatura/eval/stluciatimes.com-dea.html"),
    (TRAF, "trafilatura/eval/wordsmith.org.maudlin.html"),
    (TRAF, "trafilatura/eval/banyuetan.org.1000200033136171577956287380194268_1.html"),
    ("mozilla_readability_test_pages.tar.xz", "test-pages/youth/source.html"),
    ("postlight_parser_fixtures.tar.xz", "postlight_parser_fixtures/www.itmedia.co.jp.html"),
    ("postlight_parser_fixtures.tar.xz", "postlight_parser_fixtures/wired.jp.html"),
]


def main() -> None:
    rows = []
    for tar_name, member in PAGES:
        with tarfile.open(SHARED_DATA / "html" / tar_name) as tar:
            names = [m for m in tar.getnames() if m.endswith(member)]
            html = tar.extractfile(names[0]).read()
        rows.append({"id": member.split("/", 1)[-1], "origin": f"{tar_name}:{names[0]}",
                     "text": _resiliparse(decode_html(html, None)).strip()})
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
    langs = LanguageId(min_score=0.0).run_batch(table).table.column("lang").to_pylist()
    out = Path(__file__).parent / "pages.jsonl.gz"
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        for r, lang in zip(rows, langs):
            f.write((json.dumps({**r, "lang": lang}, ensure_ascii=False) + "\n").encode())
    print(out, [(r["id"][:30], lang, len(r["text"])) for r, lang in zip(rows, langs)])


if __name__ == "__main__":
    main()
