"""Tokenizers: train a byte-level BPE (``tokenizers``) or a Unigram model (``sentencepiece``)
on a run's Parquet shards, and use either through one ``Tokenizer`` interface.

A trained tokenizer is a directory::

    tokenizer.json | spm.model   the model (its sha256 is the tokenizer's fingerprint)
    card.json                    kind, vocab size, special token ids, what it was trained on
                                 (files + sha256), docs/bytes seen, seconds, peak RSS, versions

Training streams record batches of the ``text`` column; the corpus is never held in memory by
this code (sentencepiece keeps its own sentence sample, bounded by ``max_sentences``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import resource
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Literal, Sequence

import numpy as np
import pyarrow as pa

from curation.io import location
from curation.io.files import file_sha256, write_bytes

EOS = "<|endoftext|>"
PAD = "<|pad|>"
UNK = "<unk>"  # sentencepiece needs one; byte fallback means it is never produced for UTF-8 text
CARD = "card.json"
MODEL_FILES = {"bpe": "tokenizer.json", "unigram": "spm.model"}
#: Version of the training recipe (pre-tokenizer, normalisation, special ids); in every card.
RECIPE_VERSION = 1


class TokenizerError(ValueError):
    """A tokenizer directory or training input that cannot be used; the message says why."""


# ---------------------------------------------------------------------------------------------
# the training corpus: Parquet shards of a stage, or any list of files


@dataclass
class ParquetCorpus:
    """Parquet files to stream text from, with the sha256 of each (from the stage manifest when
    there is one, else computed)."""

    files: list[str]
    sha256: list[str] = field(default_factory=list)

    @classmethod
    def resolve(cls, paths: str | Path | Sequence[str | Path]) -> ParquetCorpus:
        """A folder (its ``*.parquet``), a glob, or files. A run's ``RUN/STAGE`` (its committed
        shards, unions resolved) is ``curation.pipeline.rundir.resolve_corpus``'s job."""
        if isinstance(paths, (str, Path)):
            paths = [paths]
        found: list[tuple[str, str | None]] = []
        for raw in paths:
            p = Path(raw)
            if p.is_dir():
                files = sorted(str(f) for f in p.glob("*.parquet") if not f.name.startswith("."))
                if not files:
                    raise TokenizerError(f"{raw}: no .parquet files in this folder")
                found += [(f, None) for f in files]
            elif any(c in str(raw) for c in "*?["):
                import glob

                files = sorted(glob.glob(str(raw)))
                if not files:
                    raise TokenizerError(f"{raw}: no file matches")
                found += [(f, None) for f in files]
            elif p.is_file():
                found.append((str(p), None))
            else:
                raise TokenizerError(f"{raw}: no such stage directory, folder or file")
        seen: dict[str, str | None] = {}
        for f, sha in found:
            seen.setdefault(str(Path(f).resolve()), sha)
        files = sorted(seen)
        return cls(files, [seen[f] or file_sha256(f) for f in files])

    @property
    def fingerprint(self) -> str:
        """sha256 over the files' hashes: names the exact training data."""
        return hashlib.sha256("\n".join(sorted(self.sha256)).encode()).hexdigest()

    def num_rows(self) -> int:
        return sum(location.parquet_file(f).metadata.num_rows for f in self.files)

    def iter_batches(self, columns: Sequence[str], batch_size: int = 1024) -> Iterator[pa.RecordBatch]:
        """Record batches of ``columns`` (those present; missing ones are absent from the batch)."""
        for f in self.files:
            pf = location.parquet_file(f)
            names = set(pf.schema_arrow.names)
            if "text" in columns and "text" not in names:
                raise TokenizerError(f"{f}: no 'text' column (columns: {sorted(names)})")
            cols = [c for c in columns if c in names]
            yield from pf.iter_batches(batch_size=batch_size, columns=cols)


@dataclass
class _Seen:
    docs: int = 0
    bytes: int = 0


def _text_batches(corpus: ParquetCorpus, seen: _Seen, max_docs: int | None) -> Iterator[list[str]]:
    for batch in corpus.iter_batches(["text"]):
        texts = [t for t in batch.column(0).to_pylist() if t]
        if max_docs is not None:
            texts = texts[: max(0, max_docs - seen.docs)]
        seen.docs += len(texts)
        seen.bytes += sum(len(t.encode("utf-8")) for t in texts)
        if texts:
            yield texts
        if max_docs is not None and seen.docs >= max_docs:
            return


def _lines(batches: Iterable[list[str]], max_line_bytes: int) -> Iterator[str]:
    # sentencepiece learns from sentences: lines of each document. Newlines themselves are
    # encoded through byte fallback (<0x0A>), so decoding stays lossless.
    for texts in batches:
        for t in texts:
            for line in t.split("\n"):
                if line.strip() and len(line) <= max_line_bytes:
                    yield line


# ---------------------------------------------------------------------------------------------
# training


def _versions() -> dict[str, str]:
    import sentencepiece
    import tokenizers

    return {"tokenizers": tokenizers.__version__, "sentencepiece": sentencepiece.__version__,
            "pyarrow": pa.__version__, "python": platform.python_version(), "recipe": str(RECIPE_VERSION)}


def _train_bpe(batches: Iterator[list[str]], vocab_size: int, min_frequency: int, progress: bool, total: int) -> bytes:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    # GPT-2 byte-level: every byte string is encodable, no unknown token ever.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=progress,
                                  special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(batches, trainer=trainer, length=total)
    return tok.to_str().encode()


def _train_unigram(batches: Iterator[list[str]], vocab_size: int, progress: bool, max_sentences: int,
                   max_line_bytes: int, character_coverage: float) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    try:
        _spm_train(spm, buf, batches, vocab_size, progress, max_sentences, max_line_bytes, character_coverage)
    except RuntimeError as e:
        if "required_chars" in str(e):
            raise TokenizerError(f"vocab_size {vocab_size} is smaller than the characters sentencepiece must keep at "
                                 f"character_coverage {character_coverage}; raise vocab_size or lower "
                                 "character_coverage (byte fallback covers the rest)") from None
        raise
    return buf.getvalue()


def _spm_train(spm, buf, batches, vocab_size, progress, max_sentences, max_line_bytes, character_coverage) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(batches, max_line_bytes), model_writer=buf,
        model_type="unigram", vocab_size=vocab_size, hard_vocab_limit=False,  # small corpora: fewer pieces, no crash
        byte_fallback=True, character_coverage=character_coverage,
        # lossless: no NFKC, keep whitespace runs, split digits (as LLaMA's tokenizer does)
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, max_sentence_length=max_line_bytes,
        eos_id=0, eos_piece=EOS, pad_id=1, pad_piece=PAD, unk_id=2, unk_piece=UNK, bos_id=-1,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1, minloglevel=0 if progress else 2,
    )


def train_tokenizer(inputs: str | Path | Sequence[str | Path], out: str | Path, kind: Literal["bpe", "unigram"] = "bpe",
                    vocab_size: int = 32000, min_frequency: int = 2, max_docs: int | None = None,
                    max_sentences: int = 10_000_000, character_coverage: float = 0.9995,
                    progress: bool = True) -> Tokenizer:
    """Train a tokenizer on the ``text`` column of Parquet shards and save it in ``out``.

    ``inputs``: ``RUN/STAGE`` directories (their committed shards), folders of ``*.parquet``,
    globs or files. ``kind``: ``bpe`` (byte-level BPE, tokenizers) or ``unigram``
    (sentencepiece, byte fallback). Special tokens ``<|endoftext|>`` and ``<|pad|>`` get ids 0
    and 1 in both. Unigram only: ``max_sentences`` bounds sentencepiece's in-memory sentence
    sample; ``character_coverage`` is the share of characters kept as pieces (the rest are
    byte-encoded), lower it for small vocabularies over many scripts.
    Returns the loaded ``Tokenizer``; ``out/card.json`` records how it was made.
    """
    if kind not in MODEL_FILES:
        raise TokenizerError(f"kind: {kind!r} is not one of {sorted(MODEL_FILES)}")
    if vocab_size < 300:
        raise TokenizerError(f"vocab_size: {vocab_size} is too small (byte-level needs 256 + specials)")
    corpus = inputs if isinstance(inputs, ParquetCorpus) else ParquetCorpus.resolve(inputs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seen = _Seen()
    t0 = time.perf_counter()
    batches = _text_batches(corpus, seen, max_docs)
    if kind == "bpe":
        model = _train_bpe(batches, vocab_size, min_frequency, progress, corpus.num_rows())
    else:
        model = _train_unigram(batches, vocab_size, progress, max_sentences, 1 << 14, character_coverage)
    seconds = time.perf_counter() - t0
    if seen.docs == 0:
        raise TokenizerError(f"{inputs}: no non-empty text to train on")
    # Model first, card last (both atomically): a directory with a card is a complete tokenizer.
    for name in (*MODEL_FILES.values(), CARD):
        (out / name).unlink(missing_ok=True)
    write_bytes(out / MODEL_FILES[kind], model)
    tok = Tokenizer.load(out, require_card=False)
    card = {
        "kind": kind,
        "model_file": MODEL_FILES[kind],
        "model_sha256": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "requested_vocab_size": vocab_size,
        "special_tokens": {EOS: tok.eos_id, PAD: tok.pad_id},
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "options": {"min_frequency": min_frequency} if kind == "bpe" else
                   {"max_sentences": max_sentences, "byte_fallback": True, "normalization": "identity",
                    "split_digits": True, "character_coverage": character_coverage},
        "training": {
            "files": [{"file": f, "sha256": s} for f, s in zip(corpus.files, corpus.sha256)],
            "fingerprint": corpus.fingerprint,
            "docs": seen.docs,
            "bytes": seen.bytes,
            "max_docs": max_docs,
            "seconds": round(seconds, 3),
            # whole-process peak (Linux reports KiB): run training in its own process to read it
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        },
        "versions": _versions(),
    }
    write_bytes(out / CARD, (json.dumps(card, indent=2, sort_keys=True) + "\n").encode())
    tok.card = card
    return tok


# ---------------------------------------------------------------------------------------------
# using a trained tokenizer


def model_file(directory: str | Path) -> tuple[str, Path]:
    """(kind, model path) of a tokenizer directory; raises TokenizerError when there is none."""
    d = Path(directory)
    for kind, name in MODEL_FILES.items():
        if (d / name).is_file():
            return kind, d / name
    raise TokenizerError(f"{directory}: no tokenizer here (expected {' or '.join(MODEL_FILES.values())}); "
                         "train one with `refinery tokenizer train RUN/STAGE --out DIR`")


@lru_cache(maxsize=64)
def _fingerprint_cached(path: str, mtime_ns: int, size: int) -> str:
    return file_sha256(path)


def checked_tokenizer_dir(v: str) -> str:
    """Absolute tokenizer directory from a DAG, checked on the driver so a missing tokenizer fails
    the DAG before anything runs (and Ray workers find it whatever their working directory)."""
    path = os.path.abspath(os.path.expanduser(v))
    try:
        model_file(path)
    except TokenizerError as e:
        raise ValueError(str(e)) from None
    return path


def tokenizer_fingerprint(directory: str | Path) -> str:
    """sha256 of the model file (cached per file version): changes when the tokenizer is retrained."""
    _, path = model_file(directory)
    st = path.stat()
    return _fingerprint_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


class Tokenizer:
    """A trained tokenizer, BPE (``tokenizers``) or Unigram (``sentencepiece``), one interface.

    ``encode_batch`` returns one int32 array per text, without special tokens; callers add
    ``eos_id`` where a document ends. Special-token strings inside text are encoded as plain
    text, so a web page containing ``<|endoftext|>`` cannot forge a document boundary.
    """

    def __init__(self, kind: str, path: Path, backend, card: dict | None):
        self.kind = kind
        self.path = path
        self._backend = backend
        self.card = card or {}
        self.fingerprint = file_sha256(path)
        if kind == "bpe":
            self.eos_id = backend.token_to_id(EOS)
            self.pad_id = backend.token_to_id(PAD)
            self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        else:
            self.eos_id = backend.eos_id()
            self.pad_id = backend.pad_id()
            self.vocab_size = backend.get_piece_size()
        if self.eos_id is None or self.eos_id < 0 or self.pad_id is None or self.pad_id < 0:
            raise TokenizerError(f"{path}: tokenizer has no {EOS} / {PAD} tokens")

    @classmethod
    def load(cls, directory: str | Path, require_card: bool = True) -> Tokenizer:
        """Load ``tokenizer.json`` or ``spm.model`` (and ``card.json``) from ``directory``."""
        kind, path = model_file(directory)
        card_path = Path(directory) / CARD
        if require_card and not card_path.exists():
            raise TokenizerError(f"{directory}: no {CARD} (training did not finish); retrain it")
        card = json.loads(card_path.read_text()) if card_path.exists() else None
        if kind == "bpe":
            from tokenizers import Tokenizer as HFTokenizer

            backend = HFTokenizer.from_file(str(path))
            backend.encode_special_tokens = True
        else:
            import sentencepiece as spm

            backend = spm.SentencePieceProcessor(model_file=str(path))
        return cls(kind, path, backend, card)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (int32), no special tokens added. Multi-threaded in the backend."""
        if not texts:
            return []
        if self.kind == "bpe":
            encs = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
            return [np.asarray(e.ids, dtype=np.int32) for e in encs]
        ids = self._backend.encode(list(texts), out_type=int)
        return [np.asarray(x, dtype=np.int32) for x in ids]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids`` (special tokens skipped)."""
        ids = [int(i) for i in ids]
        if self.kind == "bpe":
            return self._backend.decode(ids, skip_special_tokens=True)
        return self._backend.decode(ids)

    def describe(self) -> dict:
        """What identifies this tokenizer in outputs (shard metadata, params hashes)."""
        return {"kind": self.kind, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "pad_id": self.pad_id}

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, vocab={self.vocab_size}, {self.fingerprint[:12]}, {self.path.parent})"


_LOADED: dict[tuple[str, str], Tokenizer] = {}


def load_cached(directory: str | Path) -> Tokenizer:
    """One ``Tokenizer`` per process and model version: workers load it once, not per batch."""
    key = (str(Path(directory).resolve()), tokenizer_fingerprint(directory))
    if key not in _LOADED:
        _LOADED[key] = Tokenizer.load(directory)
    return _LOADED[key]
