"""Toolbox stages: url_filter, pii, badwords, normalize (curation/stages/url_filter.py, pii.py, badwords.py, normalize.py).

On real documents (tests/data/toolbox/docs.jsonl.gz, see tests/data/README.md): news pages
with their URLs, web pages with e-mail and IP addresses, pages and sentences with bad words
in English, German, Russian and Japanese. Variants (mojibake, extra whitespace, IPv6) are
built from that real text here. The last test runs the four stages in a DAG on Ray.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from curation.stages import registry
from curation.stages.badwords import BadWordsFilter
from curation.stages.normalize import Normalize
from curation.stages.pii import PiiScrub
from curation.stages.url_filter import UrlFilter
from curation.text import badwords as bw
from curation.text.normalize import Normalizer, badness_re2
from curation.text.pii import PiiScrubber
from curation.text.state import TextState
from curation.text.urls import host_candidates, parse_entry, url_key

DATA = Path(__file__).parent / "data" / "toolbox"
DOCS = [json.loads(line) for line in gzip.open(DATA / "docs.jsonl.gz", "rt", encoding="utf-8")]
BY_ID = {d["id"]: d for d in DOCS}


def table(docs: list[dict], **extra) -> pa.Table:
    n = len(docs)
    cols = {
        "id": [d["id"] for d in docs],
        "text": pa.array([d["text"] for d in docs], pa.string()),
        "source": [d["source"] for d in docs],
        "url": pa.array([d.get("url") for d in docs], pa.string()),
        "meta": ["{}"] * n,
    }
    cols.update(extra)
    return pa.table(cols)


def docs(*ids: str) -> list[dict]:
    return [BY_ID[i] for i in ids]


def column(res, name: str) -> dict:
    return dict(zip(res.table.column("id").to_pylist(), res.table.column(name).to_pylist()))


def reasons(res) -> dict:
    ids = res.table.column("id").to_pylist()
    return dict(zip(ids, res.reasons.to_pylist() if res.reasons is not None else [None] * len(ids)))


def test_registered_rules_tables_and_the_fixture():
    for name, cls in (("url_filter", UrlFilter), ("pii", PiiScrub), ("badwords", BadWordsFilter),
                      ("normalize", Normalize)):
        assert registry[name] is cls
    assert PiiScrub.rules == Normalize.rules == ()  # they never drop
    assert "| `url_filter:{value}` | `url_block_list` | not in `report_only` | `[]` |" in UrlFilter.rules_markdown()
    assert "| `badwords:too_many` | `badwords_count` | > `max_badwords` | `0` |" in BadWordsFilter.rules_markdown()
    assert "| `badwords:too_frequent` | `badwords_frac` | > `max_badwords_frac` | off |" in BadWordsFilter.rules_markdown()
    assert len(DOCS) == 31 and sum(d["url"] is not None for d in DOCS) == 21


# ---------------------------------------------------------------------------------------------
# url_filter
# ---------------------------------------------------------------------------------------------


def test_public_suffix_list_bounds_the_subdomain_walk():
    # the PSL (tld's bundled copy, no network) says where the registered domain starts
    assert host_candidates("a.b.example.co.uk") == ["a.b.example.co.uk", "b.example.co.uk", "example.co.uk"]
    assert host_candidates("www.bbc.com") == ["www.bbc.com", "bbc.com"]
    assert host_candidates("entermedia.co.kr") == ["entermedia.co.kr"]
    assert host_candidates("co.uk") == ["co.uk"]  # a public suffix itself: only exact
    assert host_candidates("foo.blogspot.com") == ["foo.blogspot.com", "blogspot.com"]  # ICANN section only
    assert host_candidates("192.168.0.2") == ["192.168.0.2"]
    assert host_candidates("intranet.corp.localhost") == ["intranet.corp.localhost", "corp.localhost"]
    # list lines
    assert parse_entry("  # comment") is None and parse_entry("") is None
    assert parse_entry("0.0.0.0 Ads.Example.com  # hosts file") == ("domain", "ads.example.com")
    assert parse_entry("*.example.org") == ("domain", "example.org")
    assert parse_entry("https://WWW.Example.com:443/a/b/?q=1#frag") == ("url", "www.example.com/a/b?q=1")
    assert parse_entry("пример.рф") == ("domain", "xn--e1afmkfd.xn--p1ai")
    assert url_key("http://www.example.com/") == url_key("https://www.example.com") == "www.example.com"


@pytest.fixture()
def blocklist_file(tmp_path) -> Path:
    f = tmp_path / "news.txt"
    f.write_text("# news sites we do not want\n"
                 "bbc.com\n"
                 "news.com   # a lookalike of foxnews.com / sputniknews.com: must not block them\n"
                 "\n"
                 "co.uk\n"  # a public suffix: blocks only the host co.uk, never morebikes.co.uk
                 "0.0.0.0 netbits.us\n", encoding="utf-8")
    return f


def test_url_filter_domains_subdomains_lookalikes_urls_regexes(blocklist_file):
    aeb11 = BY_ID["aeb-11"]["url"]
    stage = UrlFilter(
        blocklists=[{"name": "news", "path": str(blocklist_file)},
                    # the same page with another scheme, upper-case host and a fragment
                    {"name": "pages", "entries": [aeb11.replace("http://", "HTTPS://").replace("entermedia", "EnterMedia")
                                                  + "#top"]}],
        url_regexes=[r"^https?://[^/]*\.de(?:[:/]|$)"],
        url_subwords=["WDAY"])
    res = stage.run_batch(table(DOCS))
    listed = column(res, "url_block_list")
    why = reasons(res)
    # subdomain matching: www.bbc.com is under bbc.com; www.netbits.us from a hosts-file line
    for i in ("aeb-76", "aeb-141", "traf-netbits.us.stunnel_rsync"):
        assert listed[i] == "news" and why[i] == "url_filter:news", i
    # lookalikes (foxnews.com, sputniknews.com end with "news.com") and co.uk subdomains are not blocked
    for i in ("aeb-165", "aeb-18", "aeb-65"):
        assert listed[i] is None and why[i] is None, i
    # the URL entry blocks that page only, not the other page of the same site
    assert listed["aeb-11"] == "pages" and listed["aeb-107"] is None
    # regex: .de hosts; sub-word: case-insensitive
    for i in ("traf-nmb-media.de.ebay", "traf-antary.de.wireshark", "traf-d43f330cbaf74e92b9aec85e937cb904"):
        assert why[i] == "url_filter:regex", i
    assert why["aeb-143"] == "url_filter:subword"
    # rows without a URL are never blocked
    blocked = column(res, "url_blocked")
    assert not any(blocked[d["id"]] for d in DOCS if d["url"] is None)
    assert blocked == {k: v is not None for k, v in listed.items()}
    expect = {"aeb-76", "aeb-141", "traf-netbits.us.stunnel_rsync", "aeb-11", "traf-nmb-media.de.ebay",
              "traf-antary.de.wireshark", "traf-d43f330cbaf74e92b9aec85e937cb904", "aeb-143"}
    assert {k for k, v in why.items() if v} == expect


def test_url_filter_decides_from_stored_signals(blocklist_file, tmp_path):
    stage = UrlFilter(blocklists=[{"name": "news", "path": str(blocklist_file)}], url_regexes=[r"\.de/"])
    res = stage.run_batch(table(DOCS))
    pq.write_table(res.table, tmp_path / "m.parquet")
    stored = pq.read_table(tmp_path / "m.parquet")
    assert stage.decide(stored).equals(res.reasons)
    # report_only is a threshold: same signals hash, re-decided without any URL matching
    looser = UrlFilter(blocklists=[{"name": "news", "path": str(blocklist_file)}], url_regexes=[r"\.de/"],
                       report_only=["news"])
    assert looser.signals_hash([]) == stage.signals_hash([]) and looser.params_hash([]) != stage.params_hash([])
    got = dict(zip(stored.column("id").to_pylist(), looser.decide(stored).to_pylist()))
    assert got["aeb-76"] is None and got["traf-nmb-media.de.ebay"] == "url_filter:regex"
    assert UrlFilter(blocklists=[{"name": "news", "path": str(blocklist_file)}], report_only=None).decide(stored) \
        .null_count == len(DOCS)
    # editing the list file changes the hashes (the file's content is a parameter)
    before = stage.signals_hash([])
    blocklist_file.write_text(blocklist_file.read_text() + "wired.com\n")
    assert UrlFilter(blocklists=[{"name": "news", "path": str(blocklist_file)}],
                     url_regexes=[r"\.de/"]).signals_hash([]) != before


def test_url_filter_config_errors(tmp_path):
    with pytest.raises(ValidationError, match="does not exist"):
        UrlFilter(blocklists=[{"name": "x", "path": str(tmp_path / "missing.txt")}])
    with pytest.raises(ValidationError, match="RE2"):
        UrlFilter(url_regexes=["(?<=lookbehind)x"])
    with pytest.raises(ValidationError, match="unique"):
        UrlFilter(blocklists=[{"name": "a", "entries": ["x.com"]}, {"name": "a", "entries": ["y.com"]}])
    with pytest.raises(ValidationError, match="regex"):
        UrlFilter(blocklists=[{"name": "regex", "entries": ["x.com"]}])
    # no url column at all: nothing blocked, columns typed
    res = UrlFilter(blocklists=[{"name": "a", "entries": ["bbc.com"]}]).run_batch(table(DOCS).drop_columns(["url"]))
    assert res.reasons.null_count == len(DOCS) and res.table.schema.field("url_block_list").type == pa.string()


# ---------------------------------------------------------------------------------------------
# pii
# ---------------------------------------------------------------------------------------------

REAL_EMAILS = {  # addresses in the real documents
    "aeb-11": ["thekian1@entermedia.co.kr"], "aeb-107": ["pillgoo9@gmail.com"], "aeb-119": ["info@givewell.org"],
    "aeb-149": ["louise_matsakis@wired.com"], "dclm-28": ["xtc@brrc.org"], "dclm-82": ["contact@collectspace.com"],
    "dclm-276": ["moswell@rulmail.rutgers.edu"],
}
PUBLIC_IPS = {"ewt-ip": ["24.27.98.30"], "traf-nmb-media.de.ebay": ["123.123.123.123", "123.123.122.243"],
              "traf-d43f330cbaf74e92b9aec85e937cb904": ["1.1.1.1"]}
PRIVATE_IPS = {"traf-netbits.us.stunnel_rsync": ["127.0.0.1", "192.168.0.2"], "traf-antary.de.wireshark": ["192.168.1.100"]}


def test_pii_replaces_emails_and_public_ips_in_real_text():
    stage = PiiScrub()
    t = table(DOCS)
    res = stage.run_batch(t, TextState.of(t))
    assert res.reasons is None  # never drops
    out = column(res, "text")
    emails, ips = column(res, "pii_emails"), column(res, "pii_ips")
    for i, addrs in REAL_EMAILS.items():
        expected = sum(BY_ID[i]["text"].count(a) for a in addrs)
        assert expected >= 1 and emails[i] == expected, i
        assert not any(a in out[i] for a in addrs)
        assert "email@example.com" in out[i] or "firstname.lastname@example.org" in out[i]
    for i, addrs in PUBLIC_IPS.items():
        assert ips[i] == sum(BY_ID[i]["text"].count(a) for a in addrs), i
        assert not any(a in out[i] for a in addrs)
    # the link keeps its shape, with an address from the documentation ranges (RFC 5737)
    assert re.search(r"http://(192\.0\.2|198\.51\.100|203\.0\.113)\.\d+/pictures/08-05_Garrett", out["ewt-ip"])
    for i, addrs in PRIVATE_IPS.items():  # private and loopback addresses stay, as in FineWeb
        assert ips[i] == 0 and all(a in out[i] for a in addrs), i
    untouched = set(BY_ID) - set(REAL_EMAILS) - set(PUBLIC_IPS)
    assert all(out[i] == BY_ID[i]["text"] and emails[i] == ips[i] == 0 for i in untouched)
    # the returned state is the new text's, with word counts kept only where nothing changed
    res.text.check(res.table)
    assert res.text.texts.equals(res.table.column("text").combine_chunks())
    # scrubbing again finds nothing more (replacements are recognised)
    again = stage.run_batch(res.table)
    assert again.table.column("text").equals(res.table.column("text"))
    assert pc.sum(again.table.column("pii_emails")).as_py() == pc.sum(again.table.column("pii_ips")).as_py() == 0


def test_pii_ipv6_private_switch_and_lookalikes():
    # real sentences with addresses written into them
    base = BY_ID["traf-netbits.us.stunnel_rsync"]["text"].split("\n")[0]
    text = (f"{base} Resolver 2001:4860:4860::8888 answers; fe80::1 and ::1 are local; "
            "::ffff:8.8.8.8 is mapped. At 10:30:45 we moved std::vector out. logo@2x.png is an image, "
            "me@host.local not routable, version 1.2.3.4.5 is no address.")
    new, e, ip = PiiScrubber().scrub(text)
    assert "2001:4860:4860::8888" not in new and "8.8.8.8" not in new and ip == 2
    assert all(s in new for s in ("fe80::1", "::1 are", "10:30:45", "std::vector", "logo@2x.png", "me@host.local",
                                  "1.2.3.4.5"))
    assert e == 0 and "2001:db8:" in new
    # every valid address, private ones included
    netbits = BY_ID["traf-netbits.us.stunnel_rsync"]["text"]
    _, _, n_all = PiiScrubber(only_public_ips=False).scrub(netbits)
    assert n_all == sum(netbits.count(a) for a in PRIVATE_IPS["traf-netbits.us.stunnel_rsync"])
    # the replacement depends on the address only: same output whatever the batching
    t = table(DOCS)
    whole = PiiScrub().run_batch(t).table.column("text").to_pylist()
    parts = sum((PiiScrub().run_batch(t.slice(i, 4)).table.column("text").to_pylist() for i in range(0, len(DOCS), 4)), [])
    assert whole == parts


# ---------------------------------------------------------------------------------------------
# badwords
# ---------------------------------------------------------------------------------------------


def reference_count(text: str, lang: str) -> int:
    """datatrove's C4BadWordsFilter regex (Python ``re``, lower-cased text) over the shipped
    list, counting matches instead of stopping at the first; overlapping boundaries allowed."""
    words = bw.load_words(lang)
    alternation = "|".join(re.escape(w) for w in words)
    if lang in ("ja", "th", "zh"):
        return len(re.findall(alternation, text.lower()))
    return len(re.findall(rf"(?<!\w)(?:{alternation})(?!\w)", text.lower()))


def test_shipped_lists_and_licence():
    langs = bw.shipped_languages()
    assert {"en", "de", "ru", "ja", "zh", "fr", "es", "fil", "no"} <= set(langs) and len(langs) == 28
    assert (bw.DATA_DIR / "LICENSE").read_text().startswith("Attribution 4.0 International")
    assert bw.list_language("tl") == "fil" and bw.list_language("nb") == "no" and bw.list_language("xx") is None
    assert "性" not in bw.load_words("zh") and "sm" not in bw.load_words("ja")
    assert all(w == w.lower() for w in bw.load_words("es"))


def test_badwords_drops_per_language_and_counts_like_the_reference():
    langs = {d["id"]: d.get("lang") or ("de" if d["id"] == "aeb-128" else "ru" if d["id"] == "aeb-143"
                                        else "ja" if d["id"] == "aeb-93" else "ko" if d["id"] in ("aeb-11", "aeb-107")
                                        else "en") for d in DOCS}
    t = table(DOCS, lang=pa.array([langs[d["id"]] for d in DOCS], pa.string()))
    res = BadWordsFilter().run_batch(t)
    counts, why = column(res, "badwords_count"), reasons(res)
    for d in DOCS:
        assert counts[d["id"]] == reference_count(d["text"], langs[d["id"]]), d["id"]
    # C4: any match drops
    assert why["aeb-76"] == "badwords:too_many" and counts["aeb-76"] == 1  # "dick"
    assert why["aeb-18"] == "badwords:too_many" and counts["aeb-18"] == 8
    for i in ("aeb-119", "aeb-149", "aeb-128", "aeb-143", "aeb-93", "dclm-28", "lingua-de-10", "lingua-ru-10",
              "lingua-ja-10"):
        assert why[i] is None and counts[i] == 0, i
    # each document is checked against its own language's list
    assert why["lingua-de-700"] == "badwords:too_many"  # "fick" (German list)
    assert why["lingua-ru-50"] == "badwords:too_many"  # Russian list
    assert why["lingua-ja-125"] == "badwords:too_many"  # Japanese: no word boundaries
    as_english = BadWordsFilter().run_batch(table(docs("lingua-de-700", "lingua-ru-50", "lingua-ja-125")))
    assert as_english.reasons.null_count == 3  # no lang column: default_lang en, whose list has none of them


def test_badwords_thresholds_languages_without_list_and_own_lists(tmp_path):
    t = table(DOCS)  # no lang column: English for all
    res = BadWordsFilter().run_batch(t)
    pq.write_table(res.table, tmp_path / "m.parquet")
    stored = pq.read_table(tmp_path / "m.parquet")
    counts = column(res, "badwords_count")
    # re-decided from stored columns with other thresholds
    loose = BadWordsFilter(max_badwords=2)
    assert loose.signals_hash([]) == BadWordsFilter().signals_hash([])
    got = dict(zip(stored.column("id").to_pylist(), loose.decide(stored).to_pylist()))
    assert got["aeb-76"] is None and got["aeb-141"] == "badwords:too_many"  # 1 and 3 matches
    assert {i for i, r in got.items() if r} == {i for i, c in counts.items() if c > 2}
    frac = BadWordsFilter(max_badwords=None, max_badwords_frac=0.001)
    got = dict(zip(stored.column("id").to_pylist(), frac.decide(stored).to_pylist()))
    fr = column(res, "badwords_frac")
    assert fr["aeb-18"] == pytest.approx(8 / len(BY_ID["aeb-18"]["text"].split()), rel=1e-6)
    assert {i for i, r in got.items() if r} == {i for i, f in fr.items() if f > 0.001} != set()
    assert all(r in (None, "badwords:too_frequent") for r in got.values())
    # a language without a list: not checked (null count), kept
    res = BadWordsFilter().run_batch(table(docs("aeb-76"), lang=pa.array(["sw"])))
    assert res.table.column("badwords_count").to_pylist() == [None] and res.reasons.to_pylist() == [None]
    res = BadWordsFilter(default_lang=None).run_batch(table(docs("aeb-76")))
    assert res.reasons.to_pylist() == [None]
    # own list for a language
    f = tmp_path / "sw.txt"
    f.write_text("Dick\n", encoding="utf-8")
    res = BadWordsFilter(word_lists={"sw": str(f)}).run_batch(table(docs("aeb-76"), lang=pa.array(["sw"])))
    assert res.reasons.to_pylist() == ["badwords:too_many"]


# ---------------------------------------------------------------------------------------------
# normalize
# ---------------------------------------------------------------------------------------------


def mojibake(text: str) -> str:
    """UTF-8 bytes read as Windows-1252, as browsers decode it (WHATWG: the five bytes cp1252
    leaves undefined, e.g. the 0x9D of a UTF-8 "”", become the C1 control of the same value):
    what a page served with a wrong charset turns into."""
    import ftfy.bad_codecs  # noqa: F401  (registers "sloppy-windows-1252")

    return text.encode("utf-8").decode("sloppy-windows-1252")


def test_normalize_repairs_mojibake_of_real_text():
    import ftfy

    ids = ["aeb-128", "aeb-149", "aeb-41", "lingua-de-700", "traf-antary.de.wireshark"]
    originals = [BY_ID[i]["text"] for i in ids]
    broken = [mojibake(t) for t in originals]
    assert all(b != o for b, o in zip(broken, originals))
    assert "Ã" in broken[0] or "â€" in broken[0]
    stage = Normalize()
    fixed = stage.run_batch(table([dict(BY_ID[i], text=b) for i, b in zip(ids, broken)]))
    clean = stage.run_batch(table(docs(*ids)))
    assert fixed.table.column("text").to_pylist() == clean.table.column("text").to_pylist()
    assert fixed.table.column("normalize_fixed").to_pylist() == [True] * len(ids)
    assert fixed.reasons is None
    # the RE2 shortcut gives what ftfy gives on every document (real and broken)
    everything = [d["text"] for d in DOCS] + [mojibake(d["text"]) for d in DOCS if not d["text"].isascii()]
    norm = Normalizer(strip_trailing_spaces=False, remove_symbol_lines=False, collapse_spaces=False,
                      max_blank_lines=None, strip=False)
    repaired, changed = norm.repair(pa.array(everything))
    config = norm.ftfy_config()
    want = [ftfy.fix_text(t, config=config) for t in everything]
    assert repaired.to_pylist() == want
    assert changed.tolist() == [w != t for w, t in zip(want, everything)]
    # and ftfy's mojibake detector translated to RE2 agrees with it line by line
    from ftfy.badness import is_bad

    lines = [line for t in everything for line in t.split("\n")]
    re2 = pc.match_substring_regex(pa.array(lines), badness_re2()).to_numpy(zero_copy_only=False)
    assert re2.tolist() == [is_bad(line) for line in lines] and re2.sum() > 20


def test_normalize_removes_symbol_lines_and_cleans_whitespace():
    page = BY_ID["aeb-122"]["text"]  # a news page with seven "___" separator lines
    symbol_lines = [line for line in page.split("\n") if line.strip() and re.fullmatch(r"[\W_]+", line.strip())]
    assert len(symbol_lines) == 7
    res = Normalize().run_batch(table(docs("aeb-122")))
    out = res.table.column("text")[0].as_py()
    assert res.table.column("normalize_lines_removed").to_pylist() == [7]
    assert not any(re.fullmatch(r"[\W_]+", line.strip()) for line in out.split("\n") if line.strip())
    kept = [line.strip() for line in page.split("\n") if line.strip() and line not in symbol_lines]
    assert [line.strip() for line in out.split("\n") if line.strip()] == [" ".join(k.split()) for k in kept]
    assert res.table.column("normalize_chars_delta").to_pylist() == [len(out) - len(page)]
    # whitespace made messy around real lines comes back to the same clean text
    lines = BY_ID["aeb-149"]["text"].split("\n")
    messy = "\n\n" + "\n".join(line.replace(" ", "   ") + " \t " + ("\n\n\n\n" if i % 3 == 0 else "")
                               for i, line in enumerate(lines)) + "\r\n  \n"
    a, b = Normalize().run_batch(table([dict(BY_ID["aeb-149"], text=messy)])), Normalize().run_batch(table(docs("aeb-149")))
    assert a.table.column("text").equals(b.table.column("text"))
    clean = a.table.column("text")[0].as_py()
    assert "\n\n\n" not in clean and "  " not in clean and not re.search(r"[ \t]\n", clean)
    assert clean == clean.strip()
    # a symbol line with letters or digits stays; indentation stays
    t = "Intro line\n  - item one\n---\n© 2019 Hearst\n:)\n   indented   code"
    got = Normalizer(fix_unicode=False).normalize(pa.array([t]))
    assert got[0].to_pylist() == ["Intro line\n  - item one\n© 2019 Hearst\n   indented code"] and got[2].tolist() == [2]


def test_normalize_keeps_nulls_and_passes_a_state():
    t = table(DOCS[:5]).set_column(1, "text", pa.array([None, "", "  ", DOCS[3]["text"], DOCS[4]["text"]], pa.string()))
    state = TextState.of(t)
    counts = state.word_counts()
    res = Normalize().run_batch(t, state)
    assert res.table.column("text").to_pylist()[:3] == [None, "", ""]
    res.text.check(res.table)
    same = [a == b for a, b in zip(t.column("text").to_pylist(), res.table.column("text").to_pylist())]
    assert [c if s else -1 for c, s in zip(counts, same)] == res.text.known_word_counts().tolist()


def test_normalize_is_idempotent_on_real_and_broken_text():
    texts = [d["text"] for d in DOCS] + [mojibake(d["text"]) for d in DOCS if not d["text"].isascii()]
    t = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
    once = Normalize().run_batch(t).table
    twice = Normalize().run_batch(once.select(["id", "text"])).table
    assert twice.column("text").equals(once.column("text"))
    assert not any(twice.column("normalize_fixed").to_pylist())
    assert set(twice.column("normalize_lines_removed").to_pylist()) == {0}
    assert set(twice.column("normalize_chars_delta").to_pylist()) == {0}


# ---------------------------------------------------------------------------------------------
# the four stages in a DAG, on Ray
# ---------------------------------------------------------------------------------------------

DAG = """
name: toolbox
batch_size: 7
inputs:
  pages: {format: jsonl, paths: ["tests/data/toolbox/docs.jsonl.gz"], source: web}
stages:
  norm:   {type: normalize, input: pages}
  pii:    {type: pii, input: norm}
  urls:
    type: url_filter
    input: pii
    blocklists: [{name: news, path: %(blocklist)s}]
    url_regexes: ['^https?://[^/]*\\.de(?:[:/]|$)']
  lang:   {type: langid, input: urls, min_score: 0}
  bad:    {type: badwords, input: lang}
output: bad
"""


@pytest.mark.slow
def test_four_stages_in_a_dag_counts_add_up(tmp_path, ray_session, in_repo, blocklist_file):
    from curation.pipeline.dag import load_dag
    from curation.pipeline.executor import run_dag
    from curation.pipeline.stats import connect

    dag_file = tmp_path / "toolbox.yaml"
    dag_file.write_text(DAG % {"blocklist": blocklist_file})
    dag = load_dag(dag_file)
    run = tmp_path / "run"
    run_dag(dag, run, workers=2, quiet=True)
    con = connect(run)
    n_in = len(DOCS)
    upstream = n_in
    rejected_by = {}
    for name in ("norm", "pii", "urls", "lang", "bad"):
        rows_in = con.execute("select sum(rows_in) from manifest where stage = ?", [name]).fetchone()[0]
        kept = con.execute(f'select count(*) from "{name}"').fetchone()[0]
        rej = dict(con.execute("select reason, count(*) from rejected where stage = ? group by 1", [name]).fetchall())
        assert rows_in == upstream == kept + sum(rej.values()), name
        rejected_by[name] = rej
        upstream = kept
    assert rejected_by["norm"] == rejected_by["pii"] == {}
    assert rejected_by["urls"] == {"url_filter:news": 3, "url_filter:regex": 3}
    assert sum(rejected_by["bad"].values()) > 5 and set(rejected_by["bad"]) == {"badwords:too_many"}
    total_rejected = con.execute("select count(*) from rejected").fetchone()[0]
    kept = con.execute("select count(*) from kept").fetchone()[0]
    assert kept + total_rejected == n_in and kept > 5
    # what reached the output was scrubbed and normalised; the signals travel with the rows
    rows = con.execute("select id, text, pii_emails, normalize_lines_removed, badwords_count, url_blocked "
                       "from kept").fetchall()
    for doc_id, text, n_email, _, n_bad, blocked in rows:
        assert n_bad == 0 and blocked is False
        assert not any(a in text for addrs in REAL_EMAILS.values() for a in addrs)
    assert sum(r[2] for r in rows) >= 3
    # each document was checked against the list of the language langid gave it
    rej = con.execute("select meta, lang, reason from rejected where stage = 'bad'").fetchall()
    by_doc = {json.loads(meta)["id"]: (lang, reason) for meta, lang, reason in rej}
    assert by_doc["lingua-de-700"] == ("de", "badwords:too_many")
    assert by_doc["lingua-ru-50"] == ("ru", "badwords:too_many")
    assert by_doc["lingua-ja-125"] == ("ja", "badwords:too_many")
