"""`refinery eval extract` (issue #53): the measures of curation/text/extract_eval.py on hand-made
pages (each can fail: lost indentation, a flattened table, a dropped heading), and the command end
to end on real pages with structured gold (Mozilla readability fixtures in tests/data/extract)."""

from __future__ import annotations

import json
import lzma

from typer.testing import CliRunner

from conftest import DATA
from curation.cli import app
from curation.text import extract_eval as xe

GOLD = """<html><body><h2>Install</h2><ul><li>fast</li><li>small</li></ul>
<pre>def f(x):
    if x:
        return 1
</pre>
<table><tr><th>name</th><th>size</th></tr><tr><td>alpha</td><td>10</td></tr></table></body></html>"""


def test_structure_kept_is_one_when_all_is_kept():
    st = xe.gold_structure(GOLD)
    assert st.code == [["def f(x):", "    if x:", "        return 1"]] and st.rows == [["name", "size"], ["alpha", "10"]]
    out = "## Install\n\n- fast\n- small\n\n```\ndef f(x):\n    if x:\n        return 1\n```\n\n| name | size |\n| --- | --- |\n| alpha | 10 |"
    got = xe.structure_kept(out, st)
    assert all(k == n and n > 0 for k, n in got.values()), got


def test_lost_indentation_flattened_table_and_missing_heading_score_lower():
    st = xe.gold_structure(GOLD)
    flat = "Install fast small\ndef f(x):\nif x:\nreturn 1\nname\nsize\nalpha\n10"
    got = xe.structure_kept(flat, st)
    assert got["code_lines"] == (1, 3)  # only the unindented line survives as written
    assert got["table_rows"] == (0, 2)  # cells on lines of their own are not rows
    assert got["headings"] == (0, 1) and got["list_items"] == (0, 2)


def test_word_prf_and_snippets():
    assert xe.word_prf("a b c", "a b c") == (1.0, 1.0, 1.0)
    p, r, f = xe.word_prf("a b x y", "a b c d")
    assert p == r == f == 0.5
    assert xe.snippet_rates("Hello  world. Footer", ["Hello world."], ["Impressum", "Footer"]) == (1, 1, 1, 2)


def test_eval_extract_command_on_real_pages(tmp_path):
    rows = []
    for name in ("mozilla_001", "mozilla_keep_tabular_data"):
        src = lzma.decompress((DATA / "extract" / f"{name}_source.html.xz").read_bytes()).decode()
        gold = lzma.decompress((DATA / "extract" / f"{name}_expected.html.xz").read_bytes()).decode()
        rows.append(json.dumps({"id": name, "html": src, "gold": gold}))
    (tmp_path / "gold.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "rep.json"
    res = CliRunner().invoke(app, ["eval", "extract", "--gold", str(tmp_path / "gold.jsonl"), "--engines",
                                   "resiliparse,resiliparse:markdown", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    text, md = (rep["engines"][e]["sets"]["gold.jsonl"] for e in ("resiliparse", "resiliparse:markdown"))
    assert text["pages"] == md["pages"] == 2
    assert md["f1"] > 0.8 and abs(md["f1"] - text["f1"]) < 0.05  # markup is not counted as words
    assert md["table_rows"] >= max(0.9, text["table_rows"])  # Markdown keeps the tabular page's rows as rows
    assert md["code_lines"] >= 0.98
    bad = CliRunner().invoke(app, ["eval", "extract", "--gold", str(tmp_path / "gold.jsonl"), "--engines", "resiliparse:html"])
    assert bad.exit_code != 0 and "neither a format" in bad.output
