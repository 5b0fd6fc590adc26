"""HTML -> text engines: decoding page bytes and the extractors the ``extract`` stage (and the
extraction evals, ``reextract``) run. No Ray, no run directory: one page in, one string out."""

from __future__ import annotations

from contextlib import suppress


def decode_html(html: bytes, charset: str | None) -> str:
    """Bytes -> str. Valid UTF-8 wins (headers and detectors often mislabel it), then the HTTP
    charset if it decodes strictly, then resiliparse's detector (HTML meta, then content)."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding, map_encoding_to_html5

    if not html.isascii() and b"\x00" not in html:  # NULs: UTF-16/32, which is valid "UTF-8" too
        with suppress(UnicodeDecodeError):
            return html.decode("utf-8").removeprefix("\ufeff")
    if charset:
        with suppress(UnicodeDecodeError, LookupError, TypeError):  # wrong or unknown charset
            return html.decode(map_encoding_to_html5(charset)).removeprefix("\ufeff")
    return bytes_to_str(html, detect_encoding(html, from_html_meta=True))


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    # comments, bylines/dates and list bullets are not main text: F1 0.911 -> 0.935 on the
    # article-extraction benchmark's 181 gold pages (tests/benchmarks/bench_extract.py)
    return extract_plain_text(html, main_content=True, alt_texts=False, comments=False, post_meta=False,
                              list_bullets=False)


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, include_tables=False, favor_precision=False,
                               deduplicate=False) or ""


ENGINES = {"resiliparse": _resiliparse, "trafilatura": _trafilatura}


def extract_text(html: str, engine: str = "resiliparse") -> str:
    """One decoded page -> its main text with ``engine`` (a key of ``ENGINES``)."""
    try:
        fn = ENGINES[engine]
    except KeyError:
        raise ValueError(f"unknown extraction engine {engine!r}; known: {sorted(ENGINES)}") from None
    return fn(html)
