"""Build the compiled kernels once per machine (``refinery warmup``).

The word splitter, the n-gram repetition counter, langid's text sampling, Markdown's plain view,
fastText inference and the block model's trees are numba functions compiled on first call and cached on disk
(``cache=True``). Without a warm cache, every Ray
worker of the first run compiles them at once (~3x slower first run). Running each path once
here, on a tiny batch with the real types, writes the cache where workers read it: next to
the package when that is writable (a clone, a Docker build), else numba's user-wide cache
directory (or ``NUMBA_CACHE_DIR``), which is where numba also looks from a read-only install.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa

_WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the tall green tree "
          "and people walk to the market to buy fresh bread, cheese and apples for the evening meal").split()


def _sample_texts(n: int = 24) -> list[str]:
    """English-like documents with repeated lines and paragraphs (every signal has work)."""
    out = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(60 + 5 * i)]
        line = " ".join(words[:12]).capitalize() + "."
        paras = [" ".join(words[k:k + 20]).capitalize() + "." for k in range(0, len(words), 20)]
        out.append("\n".join(paras + [line, line, "Read more...", "Privacy policy"]) + f" {i}")
    return out


def warm_kernels() -> dict[str, float]:
    """Run every compiled path once. Returns seconds per path (the first time: compiling)."""
    from curation.dedup.minhash import MinHasher
    from curation.quality.classifier import load_scorer, train_quality_classifier
    from curation.stages.c4_quality import C4QualityFilter
    from curation.stages.fineweb_quality import FineWebQualityFilter
    from curation.stages.gopher_quality import GopherQualityFilter
    from curation.stages.gopher_repetition import GopherRepetitionFilter
    from curation.stages.langid import LanguageId
    from curation.text.markup import plain_view

    texts = _sample_texts()
    batch = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
    took: dict[str, float] = {}
    for stage in (LanguageId(), GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()):
        t0 = time.perf_counter()
        stage.setup()
        stage.run_batch(batch)
        took[stage.type] = time.perf_counter() - t0
    t0 = time.perf_counter()
    MinHasher(num_perm=16, ngram=5).signatures(pa.array(texts))
    took["minhash"] = time.perf_counter() - t0
    t0 = time.perf_counter()  # format: markdown's plain view (what the filters and dedup measure)
    plain_view(pa.array(["# Head\n\n| a | b |\n| --- | --- |\n- **x** *y* $z$ \\* ```"] + texts))
    took["markup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # a throwaway model: only the kernels' types matter
        labels = Path(tmp) / "labels.txt"
        labels.write_text("".join(f"__label__{'hq' if i % 2 else 'lq'} {' '.join(t.split())}\n" for i, t in enumerate(texts * 4)))
        model = Path(tmp) / "m.bin"
        train_quality_classifier(labels, model, dim=16, epoch=5, lr=0.05, min_count=1, bucket=10_000, heldout=0.2)
        load_scorer(model).score(pa.array(texts))
    took["fasttext"] = time.perf_counter() - t0
    t0 = time.perf_counter()  # the blocks engine's trees (the shipped model on a small page)
    from curation.extract.main_content import extract_blocks

    # a page with a title: the title-overlap kernel compiles here, not on a run's first titled page
    extract_blocks("<html><head><title>Warm up</title></head><body><nav><a href='/'>Home</a></nav><p>"
                   + texts[0] + "</p></body></html>")
    took["blocks"] = time.perf_counter() - t0
    return took


def cache_location() -> str:
    """Where numba writes this package's kernel caches (for the log line)."""
    from numba import config

    if config.CACHE_DIR:
        return config.CACHE_DIR
    pkg = Path(__file__).resolve().parents[1] / "text" / "__pycache__"
    return str(pkg) if os.access(pkg.parent, os.W_OK) else "numba's user-wide cache directory"
