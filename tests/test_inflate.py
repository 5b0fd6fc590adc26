"""gzip WARC members inflated with ISA-L give zlib's result exactly: the same bytes, the same
error and the same member end, on the real Common Crawl members in tests/data/warc and on
copies of them truncated or with bytes overwritten (header, deflate body, CRC trailer). zlib is
the reference (``Member(fast=False)``); ISA-L replays a member with zlib whenever it stops
early, so broken members are read exactly as before."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from conftest import REPO
from curation.io import ranges
from curation.io.ranges import Member, Source



def test_isal_is_installed():
    """isal is a dependency (pyproject.toml): without it every test here would compare zlib
    with itself, so its absence is a failure, not a skip."""
    assert ranges.isal_zlib is not None, "isal is missing: pip install -e . installs it"

WARCS = sorted((REPO / "tests" / "data" / "warc").glob("*.warc.gz"))


def members(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every gzip member, found with zlib."""
    out, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        d.decompress(data[pos:])
        assert d.eof
        end = len(data) - len(d.unused_data)
        out.append((pos, end))
        pos = end
    return out


def read_member(path: Path, offset: int, fast: bool, sizes: list[int]) -> tuple[bytes, str | None, int | None]:
    """The member read the way FastWARC reads it (pieces of varying size), then drained."""
    with Source(str(path), chunk=4096) as src:
        m = Member(src, offset, fast=fast)
        parts, i = [], 0
        while True:
            b = m.read(sizes[i % len(sizes)])
            i += 1
            if not b:
                break
            parts.append(b)
        m.drain()
        return b"".join(parts), m.error, m.end


def test_sound_members_match_zlib():
    n = 0
    for path in WARCS:
        data = path.read_bytes()
        for start, end in members(data):
            fast = read_member(path, start, True, [8192, 17, 65536])
            ref = read_member(path, start, False, [8192, 17, 65536])
            assert fast == ref and ref[1] is None and ref[2] == end
            assert ref[0] == zlib.decompress(data[start:end], 31)
            n += 1
    assert n > 100  # every member of the four real WARCs


@pytest.mark.parametrize("kind", ["truncate", "overwrite", "overwrite_many", "trailer"])
def test_broken_members_match_zlib(tmp_path, kind):
    rng = random.Random(kind)
    cases = differ = broken = 0
    for path in WARCS:
        data = path.read_bytes()
        spans = members(data)
        for start, end in rng.sample(spans, min(40, len(spans))):
            raw = bytearray(data[start:end])
            if kind == "truncate":
                raw = raw[:rng.randrange(10, len(raw))]
            elif kind == "overwrite":
                i = rng.randrange(10, len(raw))
                raw[i] ^= rng.randrange(1, 256)
            elif kind == "overwrite_many":
                for _ in range(8):
                    i = rng.randrange(10, len(raw))
                    raw[i] = rng.randrange(256)
            else:  # the CRC32 / ISIZE trailer
                i = len(raw) - rng.randrange(1, 9)
                raw[i] ^= 0xFF
            f = tmp_path / f"m{cases}.gz"
            f.write_bytes(bytes(raw) + data[end:end + 64])  # the next member's head follows
            fast = read_member(f, 0, True, [4096, 1, 30000])
            ref = read_member(f, 0, False, [4096, 1, 30000])
            differ += fast != ref
            broken += ref[1] is not None
            cases += 1
    assert cases >= 100 and broken > cases // 2  # the corruptions do break members
    assert differ == 0


def test_reference_by_environment(monkeypatch):
    monkeypatch.setenv("REFINERY_INFLATE", "zlib")
    assert ranges.fast_inflate() is False
    monkeypatch.delenv("REFINERY_INFLATE")
    assert ranges.fast_inflate() is True
