"""fastText models: safe loading (shared with language ID), training a quality classifier with a
card beside it, and scoring texts in whole batches.

Loading is guarded: fastText's C++ loader crashes the process (SIGSEGV, SIGFPE) or loops forever
on a truncated file, so ``check_fasttext_file`` walks the file format in Python first (header,
dictionary, matrices) and refuses a file whose size does not match what its header announces.
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
import re
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.io.files import atomic_path, file_sha256, write_json
from curation.text.arrow import readonly_bytes

#: fastText's file signature (``FASTTEXT_FILEFORMAT_MAGIC_INT32``) and the versions it loads.
FASTTEXT_MAGIC = 793712314
FASTTEXT_VERSIONS = (11, 12)
_KSUB = 256  # centroids per sub-quantizer in fastText's product quantizer

#: how many times this process loaded each model file (path -> count); tests read it to prove
#: that a worker loads a model once, not once per batch.
LOADS: Counter = Counter()
_MODELS: dict[tuple[str, int, int], Any] = {}


class ModelLoadError(ValueError):
    """A model file that is missing, unreadable or not a complete fastText model."""


class _Reader:
    """Bounds-checked little-endian reads over a buffer (fastText writes native x86 order)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise ModelLoadError(f"file is truncated (ends at byte {self.size}, needs {self.pos + n})")
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v if len(v) > 1 else v[0]

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelLoadError(f"file is truncated (ends at byte {self.size}, needs {self.pos + max(n, 0)})")
        self.pos += n

    def cstring(self) -> None:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ModelLoadError("file is truncated inside the dictionary")
        self.pos = end + 1


def _skip_matrix(r: _Reader, quantized: bool, dim: int) -> tuple[int, int]:
    if not quantized:
        m, n = r.take("<qq")
        if m < 0 or n != dim:
            raise ModelLoadError(f"matrix shape {m}x{n} does not match dim {dim}")
        r.skip(m * n * 4)
        return m, n
    qnorm = r.take("<?")
    m, n = r.take("<qq")
    codesize = r.take("<i")
    if m < 0 or n != dim or codesize < 0:
        raise ModelLoadError(f"quantized matrix shape {m}x{n} (codes {codesize}) does not match dim {dim}")
    r.skip(codesize)
    pq_dim = r.take("<iiii")[0]
    r.skip(pq_dim * _KSUB * 4)
    if qnorm:
        r.skip(m)
        npq_dim = r.take("<iiii")[0]
        r.skip(npq_dim * _KSUB * 4)
    return m, n


def check_fasttext_file(path: str | Path) -> dict:
    """Walk a fastText ``.bin``/``.ftz`` without loading it; return its header facts.

    Raises ``ModelLoadError`` (without the field prefix) for a wrong signature, an unknown
    version, inconsistent sizes, or a file shorter or longer than its header announces."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ModelLoadError(f"not a fastText model ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(buf, size)
            magic, version = r.take("<ii")
            if magic != FASTTEXT_MAGIC:
                raise ModelLoadError("not a fastText model (wrong file signature)")
            if version not in FASTTEXT_VERSIONS:
                raise ModelLoadError(f"unsupported fastText format version {version}")
            args = r.take("<12id")
            dim, loss, model_kind, bucket = args[0], args[6], args[7], args[8]
            if not 0 < dim <= 100_000:
                raise ModelLoadError(f"implausible dimension {dim}")
            nentries, nwords, nlabels = r.take("<iii")
            _ntokens, pruneidx = r.take("<qq")
            if nentries < 0 or nwords < 0 or nlabels < 0 or nwords + nlabels != nentries or pruneidx < -1:
                raise ModelLoadError("corrupt dictionary header")
            for _ in range(nentries):
                r.cstring()
                r.skip(9)  # int64 count + int8 entry type
            r.skip(max(pruneidx, 0) * 8)  # -1 = never pruned
            quant = r.take("<?")
            rows_in, _ = _skip_matrix(r, quant, dim)
            qout = r.take("<?")
            rows_out, _ = _skip_matrix(r, quant and qout, dim)
            if r.pos != size:
                raise ModelLoadError(f"{size - r.pos} unexpected bytes after the model")
    return {"version": version, "dim": dim, "words": nwords, "labels": nlabels, "bucket": bucket,
            "quantized": bool(quant), "input_rows": rows_in, "output_rows": rows_out,
            "loss": loss, "model": model_kind}


def checked_model_path(v: str) -> str:
    """Absolute path of a fastText model given in a DAG, checked on the driver so a missing or
    corrupt file fails the DAG before anything runs (and Ray workers find it from any CWD)."""
    path = os.path.abspath(os.path.expanduser(v))
    try:
        if not os.path.isfile(path):
            raise ModelLoadError("no such file" if not os.path.exists(path) else "not a file")
        check_fasttext_file(path)
    except (ModelLoadError, OSError) as e:
        raise ValueError(f"cannot load {v!r} ({path}): {e}") from None
    return path


def load_fasttext(path: str | Path, field: str = "quality.model"):
    """The fastText model at ``path``, loaded once per process and file version (path, mtime,
    size): a retrained model is picked up, a batch never reloads. Errors name ``field`` and
    the file: ``quality.model: cannot load 'models/q.bin': file is truncated ...``."""
    import fasttext

    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e.strerror or e}") from None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    model = _MODELS.get(key)
    if model is not None:
        return model
    try:
        if p.is_dir():
            raise ModelLoadError("is a directory, not a model file")
        check_fasttext_file(p)
        # fastText prints warnings on stderr for each load; they carry nothing for our users
        model = fasttext.load_model(str(p))
    except ModelLoadError as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e}") from None
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e}") from None
    _MODELS[key] = model
    LOADS[key[0]] += 1
    return model


def predict_batch(model, texts: list[str], k: int = -1) -> tuple[list[list[str]], list[np.ndarray]]:
    """fastText predictions for many texts in one C++ call. fastText reads one line per text,
    so newlines become spaces first (it raises on ``\\n`` otherwise)."""
    clean = [t.replace("\n", " ") if "\n" in t else t for t in texts]
    labels, probs = model.predict(clean, k=k)
    return labels, probs


# ---------------------------------------------------------------------------------------------
# Text as the classifier sees it, and batch scoring

#: The one token that stands for a line break: fastText reads one line per text, and line
#: structure (many short lines: menus, lists, boilerplate) is much of what tells quality.
NEWLINE_TOKEN = "__nl__"
#: fastText splits words on these bytes (``Dictionary::readWord``).
_FT_WHITESPACE = b" \n\r\t\v\f\0"
_NL_RUN = re.compile(r"[ \n\r\t\v\f\0]*\n[ \n\r\t\v\f\0]*")
#: Written in every card: a model trained with one text preparation is never scored with another.
PREPARE_VERSION = "nl-token-v1"


def prepare_text(text: str) -> str:
    """The text fed to fastText (training and scoring alike): every run of whitespace that holds
    a line break becomes one ``__nl__`` token, and ``__label__`` (fastText's label prefix, which
    it would drop from the words) loses its meaning."""
    if "__label__" in text:
        text = text.replace("__label__", "__label_ _")
    return _NL_RUN.sub(f" {NEWLINE_TOKEN} ", text)


def fnv1a_fasttext(words: list[bytes]) -> np.ndarray:
    """fastText's word hash (FNV-1a 32-bit over the bytes taken as *signed* chars) — reference
    implementation, one word at a time; ``fasttext_kernels.fnv_hash`` is the compiled one."""
    out = np.empty(len(words), np.uint32)
    for i, w in enumerate(words):
        h = 2166136261
        for c in w:
            h = ((h ^ (c if c < 128 else c | 0xFFFFFF00)) * 16777619) & 0xFFFFFFFF
        out[i] = h
    return out


class FastTextScorer:
    """fastText supervised inference over whole Arrow batches: the same tokens, word hashes,
    bigram buckets and averaged embeddings as fastText's ``predict``, compiled with numba.

    fastText's C++ ``predict`` reads text one character at a time through an ``istream``; on
    this machine that caps a 500-word document at ~8,000 docs/s per core whatever the model
    size. Here the batch's bytes are scanned once (``fasttext_kernels.mean_logits``), and since
    the output layer is linear, ``W_out @ mean(rows) == mean(W_out @ rows)``: each input row is
    projected on the labels once at load, so a token costs one hash, one probe and one add.

    Applies to plain supervised models (softmax loss, no character n-grams, not quantized);
    ``fast`` is False otherwise and ``score`` falls back to fastText's own ``predict``. Results
    equal fastText's to float rounding, except for words whose 32-bit hash collides with a
    vocabulary word (fastText compares the strings; here the hash decides).
    """

    def __init__(self, model, positive_label: str = "__label__hq"):
        self.model = model
        labels = list(model.get_labels())
        if positive_label not in labels:
            raise ModelLoadError(f"model has no label {positive_label!r} (labels: {labels[:10]})")
        self.positive_label = positive_label
        self.pos = labels.index(positive_label)
        args = model.f.getArgs()
        self.word_ngrams = int(args.wordNgrams)
        self.bucket = int(args.bucket)
        self.fast = (str(args.loss).endswith("softmax") and int(args.maxn) == 0 and not model.is_quantized()
                     and self.word_ngrams <= 2)
        if not self.fast:
            return
        words = model.get_words()
        self.nwords = len(words)
        w_in = model.get_input_matrix()
        w_out = model.get_output_matrix()
        if len(labels) == 2:  # softmax of two = sigmoid of the logit difference: one column
            proj = (w_in @ (w_out[self.pos] - w_out[1 - self.pos]))[:, None]
        else:
            proj = w_in @ w_out.T
        self.proj = np.ascontiguousarray(proj, np.float32)
        from curation.quality import fasttext_kernels as fk

        enc = [w.encode("utf-8") for w in words]
        offsets = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(w) for w in enc], out=offsets[1:])
        hashes = fk.hash_spans(np.frombuffer(b"".join(enc) or b"\0", np.uint8), offsets)
        size = 1 << max(10, int(np.ceil(np.log2(max(len(hashes), 1) * 4))))  # load factor <= 1/4
        self._tab_h, self._tab_id = fk.build_table(hashes, size)
        self.eos_hash = np.uint32(fnv1a_fasttext([b"</s>"])[0])
        self.nl_hash = np.uint32(fnv1a_fasttext([NEWLINE_TOKEN.encode()])[0])

    def score(self, texts: pa.Array | list[str]) -> np.ndarray:
        """P(positive label) per text (float32; null texts score as empty ones)."""
        if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
            texts = pa.array(texts, pa.string())
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        texts = texts.cast(pa.large_string())
        if len(texts) == 0:
            return np.zeros(0, np.float32)
        if pc.any(pc.match_substring(texts, "__label__")).as_py():
            texts = pc.replace_substring(texts, "__label__", "__label_ _")
        if not self.fast:
            probs = predict_batch(self.model, [prepare_text(t or "") for t in texts.to_pylist()], k=-1)
            lab = self.positive_label
            return np.array([dict(zip(ls, ps)).get(lab, 0.0) for ls, ps in zip(*probs)], np.float32)
        return self._score_fast(texts)

    def _score_fast(self, texts: pa.Array) -> np.ndarray:
        from curation.quality import fasttext_kernels as fk

        n = len(texts)
        _, off_buf, data_buf = texts.buffers()
        offsets = np.frombuffer(off_buf, np.int64)[texts.offset: texts.offset + n + 1]
        base = int(offsets[0])
        nb = int(offsets[-1]) - base
        buf = readonly_bytes(data_buf if nb else b"")[base: base + nb]
        logits = fk.mean_logits(buf, offsets - base, self._tab_h, self._tab_id, self.proj, self.nwords,
                                max(self.bucket, 1), self.word_ngrams >= 2 and self.bucket > 0,
                                self.nl_hash, self.eos_hash)
        if logits.shape[1] == 1:
            return (1.0 / (1.0 + np.exp(-logits[:, 0]))).astype(np.float32)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return (e[:, self.pos] / e.sum(axis=1)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# training, card, evaluation

CARD_SUFFIX = ".card.json"


def card_path(model_path: str | Path) -> Path:
    """``models/quality.bin`` -> ``models/quality.card.json``."""
    p = Path(model_path)
    return p.with_name(p.stem + CARD_SUFFIX)


def roc_auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve (Mann-Whitney U with tied scores counted half)."""
    y = np.asarray(labels, bool)
    s = np.asarray(scores, np.float64)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), np.float64)
    sorted_s = s[order]
    # average rank over each run of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _read_label_lines(path: str | Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.startswith("__label__")]


def train_quality_classifier(labels: str | Path | Sequence[str | Path], out: str | Path, dim: int = 64,
                             epoch: int = 20, lr: float = 0.1, word_ngrams: int = 2, min_count: int = 2,
                             bucket: int = 200_000, heldout: float = 0.1, seed: int = 0,
                             positive_label: str = "__label__hq", thread: int = 1) -> dict[str, Any]:
    """Train a fastText classifier on label files; write ``out`` (.bin) and its card.

    A seeded ``heldout`` share of the labels is kept out of training and scored: the card's
    ``heldout.auc`` is the model's AUC on labels of its own kind it never saw. One thread by
    default, so the same labels and seed give the same model bytes."""
    import fasttext

    files = [labels] if isinstance(labels, (str, Path)) else list(labels)
    lines: list[str] = []
    for f in files:
        lines += _read_label_lines(f)
    if not lines:
        raise ValueError(f"quality train: no labelled lines in {', '.join(map(str, files))}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lines))
    n_held = int(round(len(lines) * heldout))
    held = [lines[i] for i in order[:n_held]]
    train = [lines[i] for i in order[n_held:]]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    train_file = out.with_name(f".{out.stem}.train.txt")
    train_file.write_text("\n".join(train) + "\n", encoding="utf-8")
    params = dict(dim=dim, epoch=epoch, lr=lr, wordNgrams=word_ngrams, minCount=min_count, bucket=bucket,
                  loss="softmax", seed=seed, thread=thread, verbose=0)
    t0 = time.perf_counter()
    try:
        # In a fresh process: after one fastText training, later ones in the same process fail
        # here with "Encountered NaN" on identical inputs (measured: a first run always succeeds,
        # later runs fail, whatever the learning rate), so each model gets its own process.
        with atomic_path(out) as tmp:
            train_fasttext_isolated(train_file, tmp, params)
    finally:
        train_file.unlink(missing_ok=True)
    seconds = time.perf_counter() - t0
    model = load_fasttext(out, field="quality train")
    if positive_label not in model.get_labels():
        raise ValueError(f"quality train: no {positive_label!r} lines in the labels (labels: {model.get_labels()})")
    heldout_metrics: dict[str, Any] = {"docs": len(held)}
    if held:
        y = [1 if line.startswith(positive_label + " ") else 0 for line in held]
        texts = [line.split(" ", 1)[1] if " " in line else "" for line in held]
        scorer = FastTextScorer(model, positive_label)
        s = scorer.score(pa.array(texts, pa.string()))
        heldout_metrics.update(auc=roc_auc(y, s), positives=int(sum(y)), negatives=int(len(y) - sum(y)),
                               accuracy_at_0_5=float(np.mean((s >= 0.5) == np.asarray(y, bool))))
    n_pos = sum(line.startswith(positive_label + " ") for line in lines)
    card = {
        "kind": "refinery.quality_classifier",
        "model_file": out.name,
        "model_sha256": file_sha256(out),
        "algorithm": "fasttext supervised",
        "fasttext_params": params,
        "prepare_text": PREPARE_VERSION,
        "positive_label": positive_label,
        "labels": model.get_labels(),
        "training_data": [{"file": str(f), "sha256": file_sha256(f)} for f in files],
        "label_balance": {"lines": len(lines), "positives": n_pos, "negatives": len(lines) - n_pos,
                          "positive_share": n_pos / len(lines)},
        "split": {"heldout_share": heldout, "seed": seed, "train_lines": len(train), "heldout_lines": len(held)},
        "heldout": heldout_metrics,
        "vocabulary": {"words": len(model.get_words()), "bucket": bucket},
        "train_seconds": round(seconds, 1),
        "seed": seed,
    }
    for f in files:  # label provenance (teacher, sources) when the label file has its sidecar
        side = Path(f"{f}.json")
        if side.exists():
            card.setdefault("label_provenance", []).append(json.loads(side.read_text()))
    cp = card_path(out)
    write_json(cp, card)
    return card


def _train_in_subprocess(train_file: str, out: str, params: dict) -> None:
    import fasttext

    fasttext.train_supervised(train_file, **params).save_model(out)


def train_fasttext_isolated(train_file: str | Path, out: str | Path, params: dict) -> None:
    """``fasttext.train_supervised(train_file, **params)`` saved to ``out``, run in a fresh
    (spawned) process: in a process that has trained fastText once, or has torch threads
    running, later trainings here end in "Encountered NaN" on inputs that train cleanly alone."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_train_in_subprocess, (str(train_file), str(out), params))


def quality_train(labels: str | Path | Sequence[str | Path], out: str | Path, **params) -> dict[str, Any]:
    """``refinery quality train LABELS... --out MODEL.bin``: see ``train_quality_classifier``."""
    return train_quality_classifier(labels, out, **params)


def read_card(model_path: str | Path) -> dict | None:
    cp = card_path(model_path)
    if not cp.exists():
        return None
    try:
        return json.loads(cp.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def load_scorer(path: str | Path, field: str = "quality.model", positive_label: str | None = None) -> FastTextScorer:
    """A ``FastTextScorer`` for the model at ``path``, once per process and file version. The
    positive label comes from the card beside the model, else ``__label__hq``; a card whose
    text preparation differs from ours is refused (scores would silently mean something else)."""
    model = load_fasttext(path, field)
    key = (id(model), positive_label)
    sc = _SCORERS.get(key)
    if sc is None:
        card = read_card(path) or {}
        if card.get("prepare_text", PREPARE_VERSION) != PREPARE_VERSION:
            raise ModelLoadError(f"{field}: cannot load {str(path)!r}: trained with text preparation "
                                 f"{card['prepare_text']!r}, this version prepares {PREPARE_VERSION!r}")
        try:
            sc = FastTextScorer(model, positive_label or card.get("positive_label", "__label__hq"))
        except ModelLoadError as e:
            raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e}") from None
        _SCORERS[key] = sc
    return sc


_SCORERS: dict[tuple[int, str | None], FastTextScorer] = {}


def read_judgements(path: str | Path, text_field: str = "text", label_field: str = "label") -> tuple[list[str], list[int]]:
    """Texts and 0/1 labels from a JSONL(.gz) file of human judgements."""
    opener = gzip.open if str(path).endswith(".gz") else open
    texts, ys = [], []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                o = json.loads(line)
                texts.append(o[text_field] or "")
                ys.append(int(o[label_field]))
    return texts, ys


def quality_eval(model: str | Path, heldout: str | Path, text_field: str = "text",
                 label_field: str = "label") -> dict[str, Any]:
    """ROC AUC of the model on human judgements (``refinery quality eval``), beside the
    length-only baseline (score = number of characters) on the same documents."""
    texts, ys = read_judgements(heldout, text_field, label_field)
    scorer = load_scorer(model)
    s = scorer.score(pa.array(texts, pa.string()))
    card = read_card(model) or {}
    return {"model": str(model), "heldout": str(heldout), "docs": len(ys), "positives": int(sum(ys)),
            "auc": roc_auc(ys, s), "length_auc": roc_auc(ys, [len(t) for t in texts]),
            "own_heldout_auc": card.get("heldout", {}).get("auc")}
