"""Tokenizer fertility: tokens per whitespace word and UTF-8 bytes per token, by source and
language, over a run's Parquet shards. A rich table on the console and a PNG bar chart.

Tokens per word is the usual fertility measure but means little for scripts written without
spaces (zh, ja, th): there a "word" is a whole clause. Bytes per token compares across
scripts (and is what sets the cost of a corpus in tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from curation.tokenizer.model import ParquetCorpus, Tokenizer


def _langs(batch: pa.RecordBatch) -> list[str]:
    names = batch.schema.names
    if "lang" in names:
        return [x or "-" for x in batch.column(names.index("lang")).to_pylist()]
    if "meta" in names:  # readers keep unknown fields (such as a dataset's own lang) in meta
        out = []
        for m in batch.column(names.index("meta")).to_pylist():
            try:
                lang = json.loads(m).get("lang") if m else None
            except (ValueError, AttributeError):
                lang = None
            out.append(lang if isinstance(lang, str) and lang else "-")
        return out
    return ["-"] * batch.num_rows


def fertility(tok: Tokenizer, inputs: str | Path | Sequence[str | Path], max_docs: int | None = None) -> list[dict]:
    """Per (source, lang): docs, words, bytes, tokens, tokens/word, bytes/token. Streams the
    shards in record batches; ``max_docs`` stops early (a sample is enough for fertility)."""
    corpus = inputs if isinstance(inputs, ParquetCorpus) else ParquetCorpus.resolve(inputs)
    acc: dict[tuple[str, str], list[int]] = {}
    seen = 0
    for batch in corpus.iter_batches(["text", "source", "lang", "meta"]):
        if max_docs is not None and seen >= max_docs:
            break
        if max_docs is not None and batch.num_rows > max_docs - seen:
            batch = batch.slice(0, max_docs - seen)
        seen += batch.num_rows
        texts = batch.column(batch.schema.names.index("text")).to_pylist()
        sources = (batch.column(batch.schema.names.index("source")).to_pylist()
                   if "source" in batch.schema.names else ["-"] * batch.num_rows)
        langs = _langs(batch)
        keep = [i for i, t in enumerate(texts) if t]
        encoded = tok.encode_batch([texts[i] for i in keep])
        words = pc.utf8_split_whitespace(pa.array([texts[i] for i in keep], pa.string()))
        n_words = pc.list_value_length(words).to_pylist()
        for j, i in enumerate(keep):
            a = acc.setdefault((sources[i] or "-", langs[i]), [0, 0, 0, 0])
            a[0] += 1
            a[1] += n_words[j] or 0
            a[2] += len(texts[i].encode("utf-8"))
            a[3] += len(encoded[j])
    rows = []
    for (source, lang), (docs, words_, bytes_, tokens) in sorted(acc.items()):
        rows.append({"source": source, "lang": lang, "docs": docs, "words": words_, "bytes": bytes_, "tokens": tokens,
                     "tokens_per_word": tokens / words_ if words_ else float("nan"),
                     "bytes_per_token": bytes_ / tokens if tokens else float("nan")})
    return rows


def plot_fertility(rows: list[dict], title: str, out_png: str | Path) -> Path:
    """Two horizontal bar charts (tokens/word, bytes/token), one bar per (source, lang)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    labels = [f"{r['source']} / {r['lang']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.3 * len(rows) + 1.4), sharey=True, layout="constrained")
    for ax, key, name in ((axes[0], "tokens_per_word", "tokens per whitespace word"),
                          (axes[1], "bytes_per_token", "UTF-8 bytes per token")):
        vals = [r[key] for r in rows]
        bars = ax.barh(range(len(rows)), vals, color="#4c72b0" if key == "tokens_per_word" else "#55a868")
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=2)
        finite = [v for v in vals if v == v and v > 0]
        if finite and max(finite) > 20 * min(finite):  # unspaced scripts (zh: a clause per "word") dwarf the rest
            ax.set_xscale("log")
            name += " (log scale)"
        ax.set_xlabel(name)
        ax.margins(x=0.15, y=0.5 / max(len(rows), 1))
    axes[0].set_yticks(range(len(rows)), labels)
    axes[0].invert_yaxis()  # the axes share y: once, so the first row is on top
    fig.suptitle(title, fontsize=10)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def tokenizer_report(tokenizer_dir: str | Path, inputs: str | Path | Sequence[str | Path],
                     out_png: str | Path | None = None, max_docs: int | None = None, console=None,
                     corpus: ParquetCorpus | None = None) -> list[dict]:
    """Fertility of the tokenizer in ``tokenizer_dir`` on ``inputs`` (``RUN/STAGE``, folders,
    globs or Parquet files): prints a rich table, writes a PNG bar chart (default
    ``TOKENIZER_DIR/fertility-<input name>.png``) and a JSON of the same rows next to it.
    ``corpus``: the files ``inputs`` stand for, when the caller resolved them (a run's stage)."""
    from rich.console import Console
    from rich.table import Table

    tok = Tokenizer.load(tokenizer_dir)
    rows = fertility(tok, corpus if corpus is not None else inputs, max_docs)
    name = Path(inputs if isinstance(inputs, (str, Path)) else inputs[0]).name.replace("*", "_") or "data"
    out_png = Path(out_png) if out_png else Path(tokenizer_dir) / f"fertility-{name}.png"
    title = f"{tok.kind} vocab {tok.vocab_size} ({tok.fingerprint[:12]}) on {name}"
    table = Table(title=title)
    for col in ("source", "lang", "docs", "words", "bytes", "tokens", "tokens/word", "bytes/token"):
        table.add_column(col, justify="left" if col in ("source", "lang") else "right")
    for r in rows:
        table.add_row(r["source"], r["lang"], f"{r['docs']:,}", f"{r['words']:,}", f"{r['bytes']:,}", f"{r['tokens']:,}",
                      f"{r['tokens_per_word']:.3f}", f"{r['bytes_per_token']:.3f}")
    tot = {k: sum(r[k] for r in rows) for k in ("docs", "words", "bytes", "tokens")}
    if rows:
        table.add_row("all", "", f"{tot['docs']:,}", f"{tot['words']:,}", f"{tot['bytes']:,}", f"{tot['tokens']:,}",
                      f"{tot['tokens'] / max(tot['words'], 1):.3f}", f"{tot['bytes'] / max(tot['tokens'], 1):.3f}",
                      style="bold")
    console = console or Console()
    console.print(table)
    if rows:
        plot_fertility(rows, title, out_png)
        console.print(f"chart: {out_png}  (rows: {out_png.with_suffix('.json')})", highlight=False)
        out_png.with_suffix(".json").write_text(json.dumps(
            {"tokenizer": tok.describe(), "inputs": [str(x) for x in ([inputs] if isinstance(inputs, (str, Path)) else inputs)],
             "rows": rows}, indent=2) + "\n")
    return rows
