"""MinHash signatures (curation.dedup.minhash): tokenising and hashing against plain-Python
references, signatures against a brute-force minimum, Jaccard error on real document pairs
against datasketch, and LSH parameters against datasketch's optimiser."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pytest

from conftest import DATA
from curation.dedup.minhash import (
    ArtifactMismatch,
    MinHasher,
    band_hashes,
    collapse_whitespace,
    estimate_jaccard,
    jaccard,
    lsh_params,
    normalize_collapsed,
    normalize_text,
    normalized_word_hashes,
    read_artifact,
    shingle_hashes,
    shingle_sets,
    word_hashes,
    write_artifact,
)

DEDUP = DATA / "dedup"
ODD_TEXTS = [
    "Hello  World\tfoo\nbar", "", None, "  a b  ", "Straße ΣΑΣ ｆｕｌｌ\u2028x\u00a0y\u3000z", "one",
    "a b c d e f g", "x" * 30 + " " + "y" * 17 + " " + "z" * 8, "   ", "end\x1fsep\x0bvt", "nul\x00byte",
]


def _docs() -> list[str]:
    with gzip.open(DEDUP / "dclm_docs_150.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _near_dup_pairs() -> list[tuple[str, str]]:
    base = {}
    with gzip.open(DEDUP / "dclm_docs_150.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            base[d["id"]] = d["text"]
    with gzip.open(DEDUP / "near_dups.jsonl.gz", "rt", encoding="utf-8") as f:
        return [(base[d["origin"]], d["text"]) for d in map(json.loads, f)]


def _reference_normalize(s: str | None) -> str:
    import unicodedata

    s = unicodedata.normalize("NFKC", s or "").casefold()
    return "".join(" " if c in "\x85\u1680\u2028\u2029\u180e" else c for c in s)


def test_normalize_and_collapse_match_python():
    norm = normalize_text(pa.array(ODD_TEXTS))
    assert norm.to_pylist() == [_reference_normalize(t) for t in ODD_TEXTS]
    collapsed = collapse_whitespace(norm)
    assert collapsed.to_pylist() == [" ".join(_reference_normalize(t).split()) for t in ODD_TEXTS]
    # a mostly-ASCII batch takes the fast path and still splices the others back in place
    docs = _docs()[:40] + ["ＡＢＣ déjà"]
    assert normalize_text(pa.array(docs)).to_pylist() == [_reference_normalize(t) for t in docs]


def test_words_and_shingles_follow_str_split():
    texts = ODD_TEXTS + _docs()[:20]
    norm = normalize_text(pa.array(texts))
    hashes, off = word_hashes(norm)
    words = [t.split() for t in norm.to_pylist()]
    assert np.diff(off).tolist() == [len(w) for w in words]
    by_word: dict[str, int] = {}
    for w, h in zip((w for ws in words for w in ws), hashes.tolist()):
        assert by_word.setdefault(w, h) == h  # the same word always hashes the same
    assert len(set(by_word.values())) == len(by_word)  # and different words differently
    for n in (1, 3, 5):
        sh, soff = shingle_hashes(hashes, off, n)
        seen: dict[tuple, int] = {}
        for i, ws in enumerate(words):
            ref = [tuple(ws[j:j + n]) for j in range(len(ws) - n + 1)] if len(ws) >= n else ([tuple(ws)] if ws else [])
            got = sh[soff[i]:soff[i + 1]].tolist()
            assert len(got) == len(ref)
            for t, h in zip(ref, got):
                assert seen.setdefault(t, h) == h
        assert len(set(seen.values())) == len(seen)


def _spaces() -> list[str]:
    """Every character ``str.isspace`` calls whitespace."""
    return [chr(c) for c in range(0x110000) if chr(c).isspace()]


def _awkward_soup() -> list[str]:
    """400 random strings of ASCII, Latin-1/Extended and the awkward characters: every Unicode
    whitespace, spacing accents whose NFKC form holds a space, combining marks, ligatures,
    full-width and mathematical letters (seeded: the pinned digests hash them)."""
    rng = random.Random(0)
    awkward = _spaces() + [chr(c) for c in (0xA8, 0xB4, 0x301, 0x3C2, 0x3A3, 0xDF, 0x130, 0xFB01, 0xFF21, 0x1D400,
                                            0x2126, 0xFDFA, 0x1C4, 0x180E, 0x200B, 0x0)]
    chars = [chr(c) for c in range(32, 127)] + [chr(c) for c in range(0xA0, 0x250)] + awkward
    return ["".join(rng.choice(chars) for _ in range(rng.randint(0, 80))) for _ in range(400)]


def test_fused_raw_text_path_equals_normalise_then_split():
    """``normalized_word_hashes`` (words cut on raw bytes, only distinct non-ASCII words
    normalised in Python) must equal normalising whole texts first, on real text and on a
    soup of the awkward characters: every Unicode whitespace, spacing accents whose NFKC
    form holds a space, combining marks, ligatures, full-width and mathematical letters."""
    spaces, soup = _spaces(), _awkward_soup()
    for batch in (ODD_TEXTS, soup, _docs(), [f"a{c}b" for c in spaces]):
        arr = pa.array(batch)
        h1, o1 = word_hashes(normalize_text(arr))
        h2, o2 = normalized_word_hashes(arr)
        assert (o1 == o2).all() and (h1 == h2).all()
    _, off = normalized_word_hashes(pa.array([f"a{c}b" for c in spaces]))
    assert (np.diff(off) == 2).all()  # every character str.split splits on splits here too


def test_key_text_from_raw_words_equals_normalising_whole_texts(monkeypatch):
    """Exact dedup's key text (``normalize_collapsed``: only the batch's distinct non-ASCII
    words normalised) must be byte for byte ``collapse_whitespace(normalize_text(...))``:
    the keys of an index built before it must still match. Real pages, the awkward soup,
    every Unicode space inside and around a word, accents that NFKC turns into a space and a
    word, and, with every word hash forced equal, the fallback that normalises each word."""
    import curation.dedup.kernels as kernels

    spaces = _spaces()
    batches = (ODD_TEXTS, _awkward_soup(), _docs(), [f"a{c}b" for c in spaces], [f" {c} " for c in spaces],
               ["", None, " ", "\u00a8", "a \u00a8", "\u00a8 a", " \u00a8 ", "x\u00a8\u0301y", "ＡＢＣ déjà Σ"],
               ["日本語" * 50] * 30 + ["é\u00a0é", "\u2028é\u2029"] * 50)
    for batch in batches:
        arr = pa.array(batch)
        want = collapse_whitespace(normalize_text(arr))
        assert normalize_collapsed(arr).to_pylist() == want.to_pylist()
        assert normalize_collapsed(pa.chunked_array([arr[:3], arr[3:]])).to_pylist() == want.to_pylist()
    real = pa.array(_docs() + ["Ｆｕｌｌ ｗｉｄｔｈ café"] * 3)
    want = collapse_whitespace(normalize_text(real)).to_pylist()
    monkeypatch.setattr(kernels, "span_hashes", lambda data, s, e: np.zeros(len(s), np.uint64))
    assert normalize_collapsed(real).to_pylist() == want  # all "colliding": each word on its own


def test_words_normalised_together_equal_each_normalised_alone():
    """The distinct non-ASCII words of a batch are normalised in one call, joined by
    newlines: each piece must be what the word gives alone (NFKC, casefold, whitespace that
    NFKC makes collapsed), combining marks at a word's start and accents that NFKC turns into
    a space included."""
    from curation.dedup.minhash import _normalize_one, _normalize_words

    texts = [t for t in _awkward_soup() + _docs() + ODD_TEXTS if t]
    words = sorted({w for t in texts for w in t.split() if not w.isascii()})
    words += ["\u0301a", "a\u0301", "\u00a8", "x\u00a8\u0301y", "ＡＢＣ", "ﬁ", "Σ", "ς", "\u0345", "\u1100\u1161"]
    assert len(words) > 200
    assert _normalize_words(words) == [" ".join(_normalize_one(w).split()) for w in words]
    assert _normalize_words([]) == []


def test_key_text_words_are_str_split_words_joined_and_lowered():
    """The compiled pass behind exact dedup's key text (``kernels.lowered_words``): each
    document's output is ``str.split()``'s words joined by one space, ASCII letters lowered,
    and the words it lists are exactly the non-ASCII ones, with their bytes in the input and
    in the output; on every Unicode space around and inside words, the awkward soup and texts
    of nothing but whitespace (where the bound on the listed words is tightest)."""
    import curation.dedup.kernels as kernels
    from curation.dedup.minhash import _WS_LEADS, _string_buffers

    def ascii_lower(w: str) -> str:
        return "".join(c.lower() if c.isascii() else c for c in w)

    spaces = _spaces()
    texts = ([t for t in ODD_TEXTS if t is not None] + _awkward_soup() + [f"a{c}b" for c in spaces] + [f"{c}é{c}" for c in spaces]
             + ["".join(spaces) * 3, " " * 50, "\n\u2028\u3000" * 20, "x", "é", "", "ÀB Çd EF", "Ⅻ A\u3000Ω"])
    offsets, data = _string_buffers(pa.array(texts, pa.string()))
    out_off, out, hd, hs, he, hos, hoe = kernels.lowered_words(data, offsets, _WS_LEADS)
    for d, t in enumerate(texts):
        assert bytes(out[out_off[d]:out_off[d + 1]]).decode() == " ".join(ascii_lower(w) for w in t.split()), t
        mine = np.flatnonzero(hd == d)
        assert [bytes(data[hs[j]:he[j]]).decode() for j in mine] == [w for w in t.split() if not w.isascii()]
        assert [bytes(out[hos[j]:hoe[j]]).decode() for j in mine] == [ascii_lower(w) for w in t.split()
                                                                      if not w.isascii()]
    assert (np.diff(hd) >= 0).all()


def test_splicing_in_replacements_keeps_one_space_between_the_words_left():
    """``kernels.splice_words`` against joining the words again: replacements longer,
    shorter, holding spaces, and empty (the word and one space beside it go) at a document's
    start, middle and end, several in a row, and documents that end up empty."""
    import curation.dedup.kernels as kernels

    rng = np.random.default_rng(0)
    choices = ["", "x", "yy", "a b", "longer word"]
    for _ in range(300):
        docs = [[("w%d" % i, rng.random() < 0.5) for i in range(rng.integers(0, 6))] for _ in range(rng.integers(1, 5))]
        joined = [" ".join(w for w, _ in doc) for doc in docs]
        out = np.frombuffer("".join(joined).encode(), np.uint8)
        out_off = np.r_[0, np.cumsum([len(j) for j in joined])].astype(np.int64)
        hd, hos, hoe, repl, want = [], [], [], [], []
        for d, doc in enumerate(docs):
            pos, words = out_off[d], []
            for w, listed in doc:
                shown = w
                if listed:
                    r = int(rng.integers(0, len(choices)))
                    hd.append(d)
                    hos.append(pos)
                    hoe.append(pos + len(w))
                    repl.append(r)
                    shown = choices[r]
                words.append(shown)
                pos += len(w) + 1
            want.append(" ".join(w for w in words if w))
        r_bytes = [c.encode() for c in choices]
        r_off = np.r_[0, np.cumsum([len(c) for c in r_bytes])].astype(np.int64)
        r_data = np.frombuffer(b"".join(r_bytes), np.uint8)
        res_off, res = kernels.splice_words(out_off, out, np.array(hd, np.int64), np.array(hos, np.int64),
                                            np.array(hoe, np.int64), np.array(repl, np.int64), r_off, r_data)
        got = [bytes(res[res_off[d]:res_off[d + 1]]).decode() for d in range(len(docs))]
        assert got == want, (docs, [choices[r] for r in repl])


def test_compiled_scan_bounds_hold_at_document_edges():
    """The compiled word scan sizes its outputs from a first pass (words after whitespace,
    non-ASCII words per run of high bytes): runs of non-ASCII bytes and multi-byte spaces
    that meet at document boundaries must stay inside those bounds and cut the same words
    as normalising first (run under NUMBA_BOUNDSCHECK=1 to check the bounds themselves)."""
    cases = (["é"] * 1000, ["aé", "éa", "é\u00a0é", "ж", ""] * 400, ["\u00a0"] * 100 + ["x\u3000y"] * 100,
             ["日本語" * 50] * 30, ["\u2028é\u2029", "é\x85é", "\u00a0\u00a0"] * 100)
    for texts in cases:
        arr = pa.array(texts)
        h1, o1 = word_hashes(normalize_text(arr))
        h2, o2 = normalized_word_hashes(arr)
        assert (o1 == o2).all() and (h1 == h2).all()


@pytest.mark.parametrize("family", ["affine32", "multiply_shift64"])
def test_signatures_equal_brute_force_minimum_in_any_block_size(family):
    texts = ODD_TEXTS + _docs()[:30]
    mh = MinHasher(num_perm=64, family=family)
    sig, n = mh.signatures(texts)
    x, off = mh.shingles(texts)
    a, b = mh.permutations()
    for i in range(len(texts)):
        seg = x[off[i]:off[i + 1]]
        if len(seg) == 0:
            assert n[i] == 0 and (sig[i] == 0xFFFFFFFF).all()
            continue
        if family == "affine32":
            ref = (np.multiply.outer(a.astype(np.uint32), seg.astype(np.uint32)) + b.astype(np.uint32)[:, None]).min(1)
        else:
            ref = ((np.multiply.outer(a, seg) + b[:, None]).min(1) >> np.uint64(32)).astype(np.uint32)
        assert (sig[i] == ref).all()
    for block in (1, 7, 100_000):  # documents cut across blocks give the same minima
        assert (MinHasher(num_perm=64, family=family, block_shingles=block).signatures(texts)[0] == sig).all()


# sha256 (first 16 hex digits) of the signature bytes + shingle counts of _pinned_texts(), as
# the numpy implementation computed them before the compiled kernels (issue 32): persisted
# signatures and bucket files must keep their meaning (MINHASH_VERSION 1)
PINNED_SIGNATURES = {
    ("affine32", 1, 128, 5): "e12d2cef7e718285",
    ("affine32", 7, 64, 3): "afbcc2c6bd7f44f7",
    ("affine32", 3, 112, 1): "f9ef028011ebdc40",
    ("multiply_shift64", 1, 128, 5): "acb59cf782dfc2d1",
    ("multiply_shift64", 7, 64, 3): "d9a83c53a2396ddb",
    ("multiply_shift64", 3, 112, 1): "f50ae235e2f437f1",
}


def _pinned_texts() -> list[str | None]:
    soup = _awkward_soup()
    return ODD_TEXTS + soup + _docs() + [b for _, b in _near_dup_pairs()]


@pytest.mark.parametrize("family,seed,num_perm,ngram", list(PINNED_SIGNATURES))
def test_signatures_byte_identical_to_pinned(family, seed, num_perm, ngram):
    import hashlib

    texts = _pinned_texts()
    assert len(texts) == 711
    sig, n = MinHasher(num_perm=num_perm, ngram=ngram, seed=seed, family=family).signatures(pa.array(texts))
    digest = hashlib.sha256(sig.tobytes() + n.astype(np.int64).tobytes()).hexdigest()[:16]
    assert digest == PINNED_SIGNATURES[(family, seed, num_perm, ngram)]


def test_jaccard_error_on_real_pairs_no_worse_than_datasketch():
    """Mean absolute error of the Jaccard estimate on real near-duplicate pairs and random
    real pairs, 128 permutations, averaged over seeds; datasketch hashes the same 5-gram
    strings. Both should sit at the binomial ideal (sqrt(J(1-J)/128)-ish)."""
    from datasketch import MinHash

    pairs = _near_dup_pairs()[:100]
    docs = _docs()
    rnd = random.Random(3)
    pairs += [tuple(rnd.sample(docs, 2)) for _ in range(30)]
    a_sets = shingle_sets([a for a, _ in pairs], 5)
    b_sets = shingle_sets([b for _, b in pairs], 5)
    true = np.array([jaccard(x, y) for x, y in zip(a_sets, b_sets)])
    ours, theirs = [], []
    for seed in range(3):
        mh = MinHasher(num_perm=128, seed=seed)
        sa, _ = mh.signatures([a for a, _ in pairs])
        sb, _ = mh.signatures([b for _, b in pairs])
        ours.append(np.abs(estimate_jaccard(sa, sb) - true).mean())
        est = []
        for a, b in pairs:
            ms = []
            for t in (a, b):
                w = _reference_normalize(t).split()
                m = MinHash(num_perm=128, seed=seed)
                m.update_batch([" ".join(w[i:i + 5]).encode() for i in range(max(1, len(w) - 4))])
                ms.append(m)
            est.append(ms[0].jaccard(ms[1]))
        theirs.append(np.abs(np.array(est) - true).mean())
    ideal = np.mean([np.abs(np.random.default_rng(s).binomial(128, true) / 128 - true).mean() for s in range(50)])
    print(f"MAE ours {np.mean(ours):.4f} datasketch {np.mean(theirs):.4f} binomial ideal {ideal:.4f}")
    assert np.mean(ours) <= np.mean(theirs) * 1.15
    assert np.mean(ours) <= ideal * 1.2


def test_lsh_params_equal_datasketch_optimiser():
    from datasketch.lsh import _optimal_param

    for threshold in (0.5, 0.7, 0.8, 0.9):
        for num_perm in (64, 128, 256):
            assert lsh_params(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)
    assert lsh_params(0.8, 128, (0.3, 0.7)) == _optimal_param(0.8, 128, 0.3, 0.7)


def test_band_hashes_equal_iff_band_values_equal():
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 4, (300, 12), dtype=np.uint32)  # tiny alphabet: many equal bands
    bh = band_hashes(sig, 4, 3)
    for i in range(0, 300, 7):
        for j in range(300):
            for band in range(4):
                same = (sig[i, band * 3:(band + 1) * 3] == sig[j, band * 3:(band + 1) * 3]).all()
                assert (bh[i, band] == bh[j, band]) == same
    assert len(set(bh[:, 0]) & set(bh[:, 1])) == 0  # bands never share a bucket


def test_artifact_header_mismatch_is_refused(tmp_path):
    mh = MinHasher()
    path = tmp_path / "sig.parquet"
    write_artifact(pa.table({"x": [1, 2]}), path, mh.header())
    assert read_artifact(path, mh.header()).num_rows == 2
    other = MinHasher(ngram=3).header()
    with pytest.raises(ArtifactMismatch, match="ngram"):
        read_artifact(path, other)
