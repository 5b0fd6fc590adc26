"""HTML -> text engines: decoding page bytes and the extractors the ``extract`` stage (and the
extraction evals, ``reextract``) run. No Ray, no run directory: one page in, one string out.

``extract_page(html, engines=..., format=..., policy=...)`` is the one entry point: ``format``
``"text"`` (plain main text, what ``extract`` always gave) or ``"markdown"`` (headings, lists,
fenced code, tables as ``| a | b |`` rows, math as ``$…$``; see ``curation.extract.markdown``);
``policy`` says how several engines combine (``curation.extract.policy``)."""

from __future__ import annotations

from contextlib import suppress
from typing import Literal, Sequence

Format = Literal["text", "markdown"]
Policy = Literal["first", "longest", "union", "route"]
FORMATS: tuple[str, ...] = ("text", "markdown")
POLICIES: tuple[str, ...] = ("first", "longest", "union", "route")


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


# comments, bylines/dates and list bullets are not main text: F1 0.911 -> 0.935 on the
# article-extraction benchmark's 181 gold pages (tests/benchmarks/bench_extract.py)
RESILIPARSE_OPTIONS = dict(main_content=True, alt_texts=False, comments=False, post_meta=False, list_bullets=False)


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, **RESILIPARSE_OPTIONS)


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, include_tables=False, favor_precision=False,
                               deduplicate=False) or ""


def _resiliparse_markdown(html: str) -> str:
    from curation.extract.markdown import resiliparse_markdown

    return resiliparse_markdown(html, RESILIPARSE_OPTIONS)


def _trafilatura_markdown(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, output_format="markdown", include_comments=False, include_tables=True,
                               include_formatting=True, favor_precision=False, deduplicate=False) or ""


def _blocks(html: str) -> str:
    from curation.extract.main_content import extract_blocks

    return extract_blocks(html, "text")


def _blocks_markdown(html: str) -> str:
    from curation.extract.main_content import extract_blocks

    return extract_blocks(html, "markdown", markdown_options=RESILIPARSE_OPTIONS)


#: engine -> page -> plain main text (``format: text``); ``blocks``: the project's learned
#: main-content decision (``curation.extract.main_content``)
ENGINES = {"resiliparse": _resiliparse, "trafilatura": _trafilatura, "blocks": _blocks}
#: engine -> page -> Markdown main text (``format: markdown``)
MARKDOWN_ENGINES = {"resiliparse": _resiliparse_markdown, "trafilatura": _trafilatura_markdown,
                    "blocks": _blocks_markdown}
#: the engines ``policy:POLICY`` eval specs combine (the two third-party engines)
POLICY_ENGINES = ("resiliparse", "trafilatura")


def engine_fn(engine: str, format: str = "text", block_model: str | None = None):
    """The one-page function of ``engine`` in ``format``; ``ValueError`` for unknown names.
    ``block_model``: a model file of ``refinery extract train`` for the ``blocks`` engine (the
    shipped one when None)."""
    if format not in FORMATS:
        raise ValueError(f"unknown extraction format {format!r}; known: {list(FORMATS)}")
    table = ENGINES if format == "text" else MARKDOWN_ENGINES
    if engine == "blocks" and block_model is not None:
        from curation.extract.main_content import extract_blocks, load_model

        model = load_model(block_model)
        return lambda html: extract_blocks(html, format, model=model, markdown_options=RESILIPARSE_OPTIONS)
    try:
        return table[engine]
    except KeyError:
        raise ValueError(f"unknown extraction engine {engine!r}; known: {sorted(table)}") from None


def extract_page(html: str, *, engines: Sequence[str] = ("resiliparse",), format: Format = "text",
                 policy: Policy = "first", block_model: str | None = None) -> str:
    """One decoded page -> its main content in ``format`` from ``engines`` combined by ``policy``:

    - ``first``: the first engine's text; the next engine only where it came back empty;
    - ``longest``: every engine runs, the longest text wins;
    - ``union``: the first engine's paragraphs, then the others' paragraphs it lacks, each put
      after the last paragraph both share (no duplicates, the first engine's order);
    - ``route``: the first engine, and the second only on pages whose cheap facts say it wins
      (``policy.route_second``).
    """
    from curation.extract.policy import combine

    if not engines:
        raise ValueError("extract_page: no engines given")
    if policy not in POLICIES:
        raise ValueError(f"unknown extraction policy {policy!r}; known: {list(POLICIES)}")
    fns = [engine_fn(e, format, block_model) for e in engines]
    if len(fns) == 1:
        return fns[0](html)
    return combine(html, fns, policy, format)
