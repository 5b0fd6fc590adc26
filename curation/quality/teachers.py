"""Teachers: whatever decides which crawl documents look like good text, before a fastText
classifier distils that judgement into something that scores 10,000s of documents a second.

One interface: ``Teacher.score(texts) -> np.ndarray`` (higher = more like the reference), and
labelling takes the top and bottom fractions of a pool (``curation.quality.labels``).

- ``ReferenceTeacher`` (GPT-3 / DCLM recipe): positives are the documents of a reference corpus
  the user names, negatives a random sample of the crawl. Its score is membership of the
  reference, so "top fraction" = the reference and "bottom" = crawl, ties broken at random.
- ``PerplexityTeacher`` (CCNet recipe, without KenLM): a small byte-level GRU language model
  trained here on the reference corpus; a document scores minus its bits per byte.
- ``CallableTeacher``: any function ``texts -> scores`` named ``pkg.module:function``.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import re
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np


class TeacherError(ValueError):
    """A teacher that cannot be built from what it was given."""


class Teacher(ABC):
    """Scores texts; higher means more like the high-quality side."""

    name: str = "teacher"

    @abstractmethod
    def score(self, texts: Sequence[str]) -> np.ndarray:
        """One float per text."""

    def describe(self) -> dict[str, Any]:
        """What made this teacher (written into label files and model cards)."""
        return {"name": self.name}


def text_key(text: str) -> str:
    """Identity of a text for membership tests (whitespace-insensitive)."""
    return hashlib.sha1(" ".join(text.split()).encode("utf-8")).hexdigest()


class ReferenceTeacher(Teacher):
    """Membership of the reference corpus: 1.0 for its documents, 0.0 for anything else."""

    name = "reference"

    def __init__(self, reference: Sequence[str]):
        if not reference:
            raise TeacherError("reference teacher: the reference corpus is empty")
        self._keys = {text_key(t) for t in reference}
        self.n_reference = len(reference)

    def score(self, texts: Sequence[str]) -> np.ndarray:
        return np.array([1.0 if text_key(t) in self._keys else 0.0 for t in texts], np.float64)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "reference_docs": self.n_reference}


# ---------------------------------------------------------------------------------------------
# perplexity: a byte-level GRU language model


class _OneThread:
    """torch on one thread: on a shared 2-core machine a 2-thread GRU step measured 36x slower
    than a 1-thread one (threads spin waiting for each other); the model is too small to gain."""

    def __enter__(self):
        import torch

        self.prev = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.prev)


class ByteLanguageModel:
    """A small byte-level GRU language model (256 symbols, no tokenizer to train or ship).

    Trained on random windows of the reference bytes; ``bits_per_byte`` is the mean next-byte
    cross-entropy of a document's first ``max_bytes`` bytes, in bits."""

    def __init__(self, hidden: int = 256, embed: int = 64, seed: int = 0):
        import torch

        torch.manual_seed(seed)
        self.hidden, self.embed, self.seed = hidden, embed, seed
        self.net = _ByteGRU(embed, hidden)
        self.history: dict[str, Any] = {}

    def fit(self, texts: Sequence[str], steps: int = 300, seq_len: int = 256, batch: int = 32,
            lr: float = 3e-3, log: Callable[[str], None] | None = None) -> ByteLanguageModel:
        with _OneThread():
            return self._fit(texts, steps, seq_len, batch, lr, log)

    def _fit(self, texts, steps, seq_len, batch, lr, log) -> ByteLanguageModel:
        import torch

        data = np.frombuffer(b"\n\n".join(t.encode("utf-8") for t in texts), np.uint8)
        if len(data) < seq_len + 2:
            raise TeacherError(f"perplexity teacher: reference corpus too small ({len(data)} bytes)")
        rng = np.random.default_rng(self.seed)
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
        self.net.train()
        t0, losses = time.perf_counter(), []
        for step in range(steps):
            starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
            win = torch.from_numpy(np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64))
            logits = self.net(win[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), win[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if log and (step + 1) % max(1, steps // 10) == 0:
                log(f"perplexity teacher: step {step + 1}/{steps} loss {np.mean(losses[-20:]) / math.log(2):.3f} bits/byte")
        self.history = {"steps": steps, "seq_len": seq_len, "batch": batch, "lr": lr,
                        "train_bytes": int(len(data)), "seconds": round(time.perf_counter() - t0, 1),
                        "final_bits_per_byte": float(np.mean(losses[-20:]) / math.log(2))}
        return self

    def bits_per_byte(self, texts: Sequence[str], max_bytes: int = 2048, batch: int = 32) -> np.ndarray:
        with _OneThread():
            return self._bits_per_byte(texts, max_bytes, batch)

    def _bits_per_byte(self, texts, max_bytes, batch) -> np.ndarray:
        import torch

        self.net.eval()
        out = np.zeros(len(texts), np.float64)
        encoded = [t.encode("utf-8")[:max_bytes] for t in texts]
        order = np.argsort([len(e) for e in encoded])  # similar lengths per batch: less padding
        with torch.no_grad():
            for lo in range(0, len(order), batch):
                idx = order[lo:lo + batch]
                seqs = [encoded[i] for i in idx]
                width = max(2, max(len(s) for s in seqs))
                arr = np.zeros((len(seqs), width), np.int64)
                mask = np.zeros((len(seqs), width - 1), bool)
                for j, s in enumerate(seqs):
                    arr[j, :len(s)] = np.frombuffer(s, np.uint8)
                    mask[j, :max(len(s) - 1, 0)] = True
                x = torch.from_numpy(arr)
                logits = self.net(x[:, :-1])
                nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1),
                                                        reduction="none").reshape(len(seqs), -1).numpy()
                m = mask.astype(np.float64)
                per_doc = (nll * m).sum(1) / np.maximum(m.sum(1), 1)
                # a document of 0 or 1 byte has nothing to predict: the worst score
                per_doc[m.sum(1) == 0] = 8.0 * math.log(2)
                out[idx] = per_doc / math.log(2)
        return out

    def save(self, path: str | Path) -> None:
        import torch

        torch.save({"state": self.net.state_dict(), "hidden": self.hidden, "embed": self.embed,
                    "seed": self.seed, "history": self.history}, path)

    @classmethod
    def load(cls, path: str | Path) -> ByteLanguageModel:
        import torch

        blob = torch.load(path, map_location="cpu", weights_only=True)
        lm = cls(hidden=blob["hidden"], embed=blob["embed"], seed=blob["seed"])
        lm.net.load_state_dict(blob["state"])
        lm.history = blob.get("history", {})
        return lm


def _ByteGRU(embed: int, hidden: int):
    import torch

    class ByteGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, embed)
            self.rnn = torch.nn.GRU(embed, hidden, batch_first=True)
            self.head = torch.nn.Linear(hidden, 256)

        def forward(self, x):
            h, _ = self.rnn(self.emb(x))
            return self.head(h)

    return ByteGRU()


class PerplexityTeacher(Teacher):
    """Minus bits per byte under a byte-level LM trained on the reference corpus (CCNet's idea:
    text the reference model finds predictable is text like the reference)."""

    name = "perplexity"

    def __init__(self, reference: Sequence[str] | None = None, lm: ByteLanguageModel | None = None,
                 steps: int = 300, max_bytes: int = 2048, seed: int = 0,
                 log: Callable[[str], None] | None = None):
        if lm is None:
            if not reference:
                raise TeacherError("perplexity teacher: needs a reference corpus (or a trained LM)")
            lm = ByteLanguageModel(seed=seed).fit(reference, steps=steps, log=log)
        self.lm, self.max_bytes = lm, max_bytes

    def score(self, texts: Sequence[str]) -> np.ndarray:
        return -self.lm.bits_per_byte(texts, max_bytes=self.max_bytes)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "lm": "byte GRU", "hidden": self.lm.hidden, "embed": self.lm.embed,
                "seed": self.lm.seed, "max_bytes": self.max_bytes, "training": self.lm.history}


class CallableTeacher(Teacher):
    """Any function ``texts -> scores`` named by import path ``pkg.module:function``."""

    name = "callable"

    def __init__(self, spec: str):
        mod_name, sep, fn_name = spec.partition(":")
        if not sep or not mod_name or not fn_name:
            raise TeacherError(f"callable teacher: {spec!r} is not 'package.module:function'")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise TeacherError(f"callable teacher: cannot import {spec!r}: {e}") from None
        if not callable(fn):
            raise TeacherError(f"callable teacher: {spec!r} is not callable")
        self.spec, self.fn = spec, fn

    def score(self, texts: Sequence[str]) -> np.ndarray:
        scores = np.asarray(self.fn(list(texts)), np.float64)
        if scores.shape != (len(texts),):
            raise TeacherError(f"callable teacher {self.spec}: returned shape {scores.shape}, "
                               f"expected ({len(texts)},)")
        return np.nan_to_num(scores, nan=-np.inf)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "function": self.spec}


_TERMINAL = re.compile(r"[.!?…\"'”’)\]]\s*$")


def prose_line_share(texts: Sequence[str]) -> np.ndarray:
    """Share of a document's characters in prose lines: lines of >= 8 words that end like a
    sentence. Boilerplate (menus, buttons, lists of links, footers) is short unterminated lines.
    A heuristic teacher for ``CallableTeacher('curation.quality.teachers:prose_line_share')``."""
    out = np.zeros(len(texts), np.float64)
    for i, t in enumerate(texts):
        total = prose = 0
        for line in t.splitlines():
            n = len(line.strip())
            if not n:
                continue
            total += n
            if len(line.split()) >= 8 and _TERMINAL.search(line):
                prose += n
        out[i] = prose / total if total else 0.0
    return out


def make_teacher(kind: str, reference: Sequence[str] | None = None, **options) -> Teacher:
    """``reference`` | ``perplexity`` | ``pkg.module:function`` (a callable teacher)."""
    if kind == "reference":
        return ReferenceTeacher(reference or [])
    if kind == "perplexity":
        return PerplexityTeacher(reference, **options)
    if ":" in kind:
        return CallableTeacher(kind)
    raise TeacherError(f"teacher {kind!r}: use reference, perplexity, or package.module:function")
