"""Compiled counters against the array code they replaced, on the real pages of
``tests/data/filters`` and on fuzzed text: Gopher's repeated lines and paragraphs
(``duplicate_parts`` against ``split_newlines`` + ``duplicate_stats``), its word tallies
(``word_tallies`` against numpy over the words), its line tallies (``line_tallies`` against
``str.splitlines`` and the per-line marks) and the repetition kernel's skipped passes."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text.counts import bullet_and_ellipsis_lines, hashes_and_ellipses, line_tallies, page_tallies, word_tallies
from curation.text.duplicate_parts import duplicate_lines_and_paragraphs, duplicate_parts
from curation.text.repetition import repetition_chars
from curation.text.segments import duplicate_stats, split_lines
from curation.text.state import TextState
from curation.text.words import split_words
from test_filters import REAL


def _fuzz(n: int, seed: int = 0) -> list[str]:
    """Texts of lines and blank runs, Python whitespace of every kind at the edges (strip),
    repeated lines and near-repeats (same length, same ends, another middle)."""
    rng = random.Random(seed)
    pieces = ["a", "b", "x y", "", " ", "\u00a0", "\u2003", "é", "中", "\t", "\r", "\x1c", "\x85", "line one",
              "\n", "\n\n", "\n\n\n", "<tr>0001</tr>", "<tr>0002</tr>", "the same line of text"]
    out = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(n)]
    return out + ["", "\n", "\n\n", " \n \n ", "a\n\na\n\na", "x" * 20 + "\n" + "x" * 20]


def test_duplicate_parts_equal_split_and_dictionary_counts():
    texts = [d["text"] for d in REAL] + _fuzz(2000)
    arr = pa.array(texts)
    state = TextState(arr)
    for got, parts in ((duplicate_parts(arr, min_run=2, strip=True), state.paragraphs),
                       (duplicate_parts(arr, min_run=1), state.newlines())):
        dups, chars = duplicate_stats(parts)
        assert np.array_equal(got[0], parts.counts)
        assert np.array_equal(got[1], dups)
        assert np.array_equal(got[2], chars)
    assert got[1].sum() > 100  # repeats were there to find
    assert duplicate_parts(pa.array(["", ""]))[0].tolist() == [1, 1]
    # both in one pass (a paragraph of one whole line takes its hash): the same six counts
    for a in (arr, arr.slice(7, 900), pa.array(["", ""]), pa.array(["\n\n", " a \n\n a", "a\nb\n\na\nb"])):
        fused = duplicate_lines_and_paragraphs(a)
        apart = duplicate_parts(a, min_run=2, strip=True) + duplicate_parts(a, min_run=1)
        assert all(np.array_equal(x, y) for x, y in zip(fused, apart))


def test_word_tallies_equal_numpy_over_the_words():
    texts = [d["text"] for d in REAL]
    words = split_words(pa.array(texts))
    stop = ["the", "and", "of", "to", "that"]
    stop_idx = words.match(stop)
    got = word_tallies(words.offsets, words.symbol, words.alpha, words.lengths.astype(np.int64), stop_idx, len(stop))
    n, doc, real, has = len(texts), words.doc, ~words.symbol, stop_idx >= 0
    assert np.array_equal(got[0], np.bincount(doc[real], minlength=n))
    assert np.array_equal(got[1], np.bincount(doc[real], weights=words.lengths[real], minlength=n).astype(np.int64))
    assert np.array_equal(got[2], np.bincount(doc[words.alpha], minlength=n))
    key = np.unique(doc[has] * (len(stop) + 1) + stop_idx[has])
    assert np.array_equal(got[3], np.bincount(key // (len(stop) + 1), minlength=n))
    assert np.array_equal(got[4], np.bincount(doc[has & real], minlength=n))
    assert got[3].max() == len(stop)


def test_repetition_kernel_skips_only_the_passes_not_asked_for():
    words = split_words(pa.array([d["text"] for d in REAL]))
    args = (words.hash, words.lengths.astype(np.int64), words.offsets, 2, 10)
    top, dup = repetition_chars(*args)
    top2, dup2 = repetition_chars(*args, top_ns=[2, 3, 4], dup_ns=[5, 6, 7, 8, 9, 10])
    assert np.array_equal(top[:, 2:5], top2[:, 2:5]) and np.array_equal(dup[:, 5:], dup2[:, 5:])
    assert not top2[:, 5:].any() and not dup2[:, :5].any() and dup[:, 2:5].any()


def test_line_tallies_equal_splitlines_and_the_per_line_marks():
    rng = random.Random(1)
    breaks = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\n\n"]
    bits = ["- item", "• item", "text", " ", "\u00a0", "...", "…", "wait...", "end… ", "-", "", "é", "#", "....", ".",
            "\u2026\u2028", "\u00c2", "\u00a0\u0085"]
    fuzz = ["".join(rng.choice(bits + breaks) for _ in range(rng.randint(0, 25))) for _ in range(2000)]
    texts = [d["text"] for d in REAL] + fuzz + ["", "\n", "a\n", "\r\n", "a\r\nb", "\n\n"]
    arr = pa.array(texts)
    lines = split_lines(arr)
    bullet, ellipsis = bullet_and_ellipsis_lines(arr, lines)
    n_lines, bullets, ellipses = line_tallies(arr)
    assert n_lines.tolist() == [len(t.splitlines()) for t in texts]
    assert np.array_equal(bullets, lines.per_doc_sum(bullet).astype(np.int64))
    assert np.array_equal(ellipses, lines.per_doc_sum(ellipsis).astype(np.int64))
    assert bullets.sum() > 100 and ellipses.sum() > 100
    # the fused pass: the same three, and "#" / "..." / "…" as str.count and the one-count kernel
    tallies = page_tallies(arr)
    assert all(np.array_equal(a, b) for a, b in zip(tallies[:3], (n_lines, bullets, ellipses)))
    assert tallies[3].tolist() == [t.count("#") for t in texts]
    assert tallies[4].tolist() == [t.count("...") + t.count("…") for t in texts]
    assert all(np.array_equal(a, b) for a, b in zip(tallies[3:], hashes_and_ellipses(arr)))


def test_byte_classes_equal_the_class_of_each_character():
    """Every byte of a character carries ``byte_class_of`` that character: real pages and a
    soup of ASCII, Latin, CJK, emoji (4-byte), combining marks and Unicode spaces, with
    non-ASCII characters at the very start and end of the buffer and back to back. Each
    text is classed twice: with the per-process table emptied (every non-ASCII character
    first seen, its bytes filled in after it is classified), then from the table."""
    from curation.text import classes
    from curation.text.classes import byte_class_of, byte_classes

    rng = random.Random(3)
    soup = [chr(c) for c in range(32, 127)] + list("éßΣжא日本語。、！？“”‘’—–…€£") + [
        "\u00a0", "\u2003", "\u3000", "\u0301", "\U0001F600", "\U00020000", "\u200b", "\ufeff"]
    texts = [d["text"] for d in REAL[:30]] + ["".join(rng.choice(soup) for _ in range(rng.randint(0, 60)))
                                             for _ in range(500)] + ["é", "日本", "\U0001F600x", "aé"]
    for text in texts + ["".join(texts[-4:])]:
        raw = text.encode()
        want = np.array([byte_class_of(c) for c in text for _ in c.encode()], np.uint16)
        classes._CP_KNOWN[:] = False
        for _ in range(2):
            got = byte_classes(np.frombuffer(raw, np.uint8)) if raw else np.zeros(0, np.uint16)
            assert np.array_equal(got, want), text[:40]
    # ASCII runs of every length up to 40 between non-ASCII characters (the scan skips ASCII 8
    # bytes at a time, at multiples of 8 from the buffer's start), the buffer starting at
    # every offset 0-8 of a larger one (its words at every alignment)
    runs = "".join("x" * rng.randrange(41) + rng.choice("é日😀 ") for _ in range(400))
    for off in range(9):
        raw = ("a" * off + runs).encode()
        want = np.array([byte_class_of(c) for c in runs for _ in c.encode()], np.uint16)
        assert np.array_equal(byte_classes(np.frombuffer(raw, np.uint8)[off:]), want), off


def test_key_sieve_passes_every_key_and_the_probe_finds_exactly_the_keys():
    """``key_sieve`` rules spans out by (first byte, last byte) with a bit per length and a
    bit per second byte (mod 15): no key may be ruled out. The compiled probe over spaCy's
    special cases and the spans of real pages' words (and the keys themselves, one byte to
    16) finds exactly the spans equal to a key."""
    from curation.text.kernels import find_keys
    from curation.text.keys import key_sieve, key_table
    from curation.text.special_cases import SPECIAL_CASES
    from curation.text.words import split_words

    keys = list(dict.fromkeys([k for k in SPECIAL_CASES if len(k.encode()) <= 16] + ["a", "é", "日本"]))
    table, order = key_table(keys)
    sieve = key_sieve(keys)
    raw = [k.encode() for k in keys]
    at, hit = find_keys(np.frombuffer(b"".join(raw), np.uint8), np.cumsum([0] + [len(r) for r in raw[:-1]]),
                        np.array([len(r) for r in raw], np.int64), table, order.astype(np.int64), sieve)
    assert at.tolist() == list(range(len(keys))) and [keys[k] for k in hit.tolist()] == keys
    texts = [d["text"] for d in REAL[:40]] + [" ".join(keys)]
    words = split_words(pa.array(texts), special_cases=False)
    spans = words.values().to_pylist()
    got_at, got_key = find_keys(words._b, words.start, words.end - words.start, table, order.astype(np.int64),
                                sieve)
    index = {k: i for i, k in enumerate(keys)}
    want_at = [i for i, w in enumerate(spans) if w in index]
    assert got_at.tolist() == want_at
    assert [keys[k] for k in got_key.tolist()] == [spans[i] for i in want_at]


def test_word_ids_are_equal_exactly_when_the_words_are():
    # Words.hash packs a word's bytes up to 16 and hashes the rest 8 at a time; held to the
    # words themselves (Arrow's dictionary encoding): no two distinct words share an id, and
    # the lengths of 1..40 bytes around the 8- and 16-byte edges (same head, another tail) are
    # among them. The character counts taken in the same pass are held to ``len``.
    edges = [("é" if k % 3 == 0 else "x") * k + tail for k in range(1, 41) for tail in ("", "y", "yz", "é")]
    texts = [d["text"] for d in REAL] + [" ".join(edges), " ".join(reversed(edges))]
    words = split_words(pa.array(texts))
    values = words.values()
    ids = pc.dictionary_encode(values).indices.to_numpy()
    _, by_hash = np.unique(words.hash, return_inverse=True)
    pairs = set(zip(ids.tolist(), by_hash.ravel().tolist()))
    assert len(pairs) == len(set(ids.tolist())) == len(set(by_hash.ravel().tolist())) > 5_000
    assert (words.byte_lengths > 16).sum() > 100
    assert np.array_equal(words.lengths, [len(v) for v in values.to_pylist()])
