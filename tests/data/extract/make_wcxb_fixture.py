"""Rebuild gold/html/wcxb_dev.tar: 2 pages of each WCXB page type from the shared dev split.

Deterministic, no looking at scores: per type, the pages whose gzipped HTML is under 25,000
bytes and whose gold has words, sorted by id, the first and the middle one. Same layout as the
shared tar (``wcxb/dev/html/ID.html.gz``, ``wcxb/dev/ground-truth/ID.json``, the LICENSE).

    python tests/data/extract/make_wcxb_fixture.py [SHARED_DATA]
"""

import io
import json
import sys
import tarfile
from pathlib import Path

here = Path(__file__).resolve().parent
shared = Path(sys.argv[1]) if len(sys.argv) > 1 else here.parents[3] / "shared" / "data"
src = shared / "html" / "wcxb_dev.tar"
html, gold, lic = {}, {}, None
with tarfile.open(src) as tf:
    for m in tf:
        if not m.isfile():
            continue
        data = tf.extractfile(m).read()
        if m.name.endswith(".html.gz"):
            html[Path(m.name).name.split(".")[0]] = (m.name, data)
        elif "/ground-truth/" in m.name:
            gold[Path(m.name).stem] = (m.name, data)
        elif m.name.endswith("LICENSE"):
            lic = (m.name, data)
by_type: dict[str, list[str]] = {}
for key, (_, data) in sorted(gold.items()):
    g = json.loads(data)
    kind = g["_internal"]["page_type"]["primary"]
    if key in html and len(html[key][1]) < 25_000 and (g["ground_truth"].get("main_content") or "").split():
        by_type.setdefault(kind, []).append(key)
chosen = sorted(k for keys in by_type.values() for k in (keys[0], keys[len(keys) // 2]))
out = here / "gold" / "html" / "wcxb_dev.tar"
out.parent.mkdir(parents=True, exist_ok=True)
with tarfile.open(out, "w") as tf:
    for name, data in [lic] + [html[k] for k in chosen] + [gold[k] for k in chosen]:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
print(out, len(chosen), "pages:", ", ".join(chosen), out.stat().st_size, "bytes")
