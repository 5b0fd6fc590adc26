"""Data ablations: does a curation recipe make a better model for the same compute?

``ablate(config, out)`` runs, for every arm (a curation DAG):

1. the arm's DAG into ``OUT/arms/NAME`` (``run_dag``: completed shards are reused);
2. a generated DAG ``OUT/decontam/NAME``: the arm's output shards (Parquet) through the
   ``decontaminate`` stage against the eval set (13-gram Bloom filter);
3. one shared tokenizer (``tokenizer:`` if it exists, else BPE trained once on the union of
   the arms' decontaminated outputs, so no eval text is in its training data);
4. a generated DAG ``OUT/pack/NAME``: tokenize + pack (``seq_len``) of the decontaminated docs;
5. training the same model config for the same token budget per seed
   (``python -m training`` in a subprocess, ``--set`` for data.path, run_dir, seed, steps,
   eval), evaluating loss on the same packed held-out eval set (``OUT/eval``) every
   ``eval_every_tokens``.

Outputs: ``OUT/report.json``, ``OUT/report.md`` (arm x final eval loss mean ± std over seeds,
tokens to reach the baseline arm's final loss, epochs each arm saw, docs/tokens kept, docs lost
to decontamination) and ``OUT/eval_loss.png``.

Config (YAML)::

    name: ablate-demo
    arms: {raw: {dag: pipelines/web-raw.yaml}, filters: {dag: pipelines/web-filters.yaml}}
    baseline: raw                 # default: the first arm
    eval: {paths: [...], source: reference, ngram: 13, max_docs: null}
    model: tiny                   # a preset, or a trainer YAML whose model/optim/... are used
    tokens: 2.0e6                 # training tokens per run (steps = tokens / (global_batch * seq_len))
    tokenizer: runs/ablate-tok    # trained here if missing
    vocab_size: 4096
    seq_len: 128
    global_batch: 8
    seeds: [0, 1, 2]
    eval_every_tokens: 2.0e5
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from curation.pipeline.dag import load_dag, parse_dag
from curation.formats.packed import PACK_REPORT
from curation.io import datapaths
from curation.io.files import atomic_path
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir, resolve_corpus


class AblateError(ValueError):
    """An ablation that cannot run; the message names the config field or the failing step."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArmConfig(_Strict):
    dag: str | dict[str, Any]  # a DAG YAML path, or the DAG itself inline


class EvalSetConfig(_Strict):
    paths: list[str] = Field(min_length=1)
    source: str = "reference"
    text_field: str = "text"
    ngram: int = Field(default=13, gt=0)
    max_docs: int | None = Field(default=None, gt=0)  # documents of the eval set packed for the loss
    batches: int | None = Field(default=None, gt=0)  # eval batches; default: every packed eval row


class AblateConfig(_Strict):
    name: str = "ablate"
    arms: dict[str, ArmConfig] = Field(min_length=1)
    baseline: str | None = None
    eval: EvalSetConfig
    model: str = "tiny"
    tokens: float = Field(gt=0)
    tokenizer: str | None = None
    vocab_size: int = Field(default=4096, gt=255)
    seq_len: int = Field(default=128, gt=0)
    global_batch: int = Field(default=8, gt=0)
    micro_batch: int = Field(default=8, gt=0)
    lr: float = Field(default=2e-3, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    seeds: list[int] = Field(default=[0, 1, 2], min_length=1)
    eval_every_tokens: float = Field(gt=0)
    # time to quality: held-out loss targets (tokens and wall seconds of the first eval at or
    # below each) and training-token budgets (the eval loss at the first eval at/after each)
    targets: list[float] = []
    token_budgets: list[float] = []
    threads: int | None = Field(default=None, gt=0)
    # trainings at once (every arm and seed is its own process); default: the CPUs this process
    # may use divided by ``threads`` (one at a time when ``threads`` is unset: torch takes them all)
    parallel: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> AblateConfig:
        if self.baseline is None:
            self.baseline = next(iter(self.arms))
        if self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not an arm ({', '.join(self.arms)})")
        if self.global_batch % self.micro_batch and self.micro_batch < self.global_batch:
            raise ValueError("global_batch must be a multiple of micro_batch")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def steps(self) -> int:
        return max(1, int(round(self.tokens / self.tokens_per_step)))

    @property
    def eval_every_steps(self) -> int:
        return max(1, int(round(self.eval_every_tokens / self.tokens_per_step)))

    @property
    def trainings_at_once(self) -> int:
        if self.parallel:
            return self.parallel
        if not self.threads:
            return 1
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cpus // self.threads)


def load_ablate_config(path: str | Path) -> AblateConfig:
    p = Path(path)
    if not p.exists():
        raise AblateError(f"{path}: no such ablation config")
    try:
        return AblateConfig.model_validate(yaml.safe_load(p.read_text()))
    except Exception as e:  # pydantic ValidationError: one line naming the field
        raise AblateError(f"{path}: {e}".replace("\n", " ")) from None


def _resolve(path: str, config_dir: Path) -> str:
    """``${REFINERY_DATA}`` expanded; relative paths from the CWD if they exist there, else from
    the config's folder."""
    try:
        p = Path(datapaths.expand(path)).expanduser()
    except datapaths.DataPathError as e:
        raise AblateError(f"{path}: {e}") from None
    if p.is_absolute() or p.exists():
        return str(p.resolve())
    q = (config_dir / p)
    return str(q.resolve()) if q.exists() else str(p.resolve())


def _log(msg: str) -> None:
    print(f"[ablate] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# curation side


def output_shards(run_dir: Path, dag) -> list[str]:
    """Absolute paths of the committed shards of the DAG's output node (non-empty only)."""
    files = [p for _, p in RunDir(run_dir).shard_files(dag, dag.output, dag.hashes())]
    return [p for p in files if pq.ParquetFile(p).metadata.num_rows > 0]


def _rows(paths: list[str]) -> int:
    return int(sum(pq.ParquetFile(p).metadata.num_rows for p in paths))


def run_arm(name: str, dag_spec: str | dict, out: Path, workers: int) -> tuple[list[str], dict]:
    dag = parse_dag(dag_spec, f"<arm {name}>") if isinstance(dag_spec, dict) else load_dag(dag_spec)
    run_dir = out / "arms" / name
    _log(f"arm {name}: curating with {dag.name} -> {run_dir}")
    run_dag(dag, run_dir, workers=workers, quiet=True, overwrite=True)
    shards = output_shards(run_dir.resolve(), dag)
    if not shards:
        raise AblateError(f"arm {name}: its DAG kept no documents")
    return shards, {"docs_curated": _rows(shards)}


def run_decontam(name: str, shards: list[str], cfg: AblateConfig, eval_paths: list[str], out: Path,
                 workers: int) -> tuple[list[str], dict]:
    d = {
        "name": f"decontam-{name}",
        "inputs": {"docs": {"format": "parquet", "paths": shards, "source": name, "id_field": "id"}},
        "stages": {"decontaminate": {"type": "decontaminate", "input": "docs", "eval_paths": eval_paths,
                                     "ngram": cfg.eval.ngram}},
        "output": "decontaminate",
    }
    dag = parse_dag(d, f"<ablate decontam {name}>")
    run_dir = (out / "decontam" / name).resolve()
    run_dag(dag, run_dir, workers=workers, quiet=True, overwrite=True)
    rundir = RunDir(run_dir)
    files = [p for _, p in rundir.shard_files(dag, "decontaminate", dag.hashes())]
    entries = rundir.committed("decontaminate", dag.hashes()["decontaminate"])
    dropped = int(sum(int(e.get("rejected_rows", 0) or 0) for e in entries.values()))
    kept = _rows(files)
    return [p for p in files if pq.ParquetFile(p).metadata.num_rows > 0], {"docs_kept": kept, "docs_decontaminated": dropped}


def run_pack(name: str, docs: list[str], tokenizer: str, cfg: AblateConfig, out: Path, workers: int,
             shuffle: bool = True) -> tuple[Path, dict]:
    d = {
        "name": f"pack-{name}",
        "inputs": {"docs": {"format": "parquet", "paths": docs, "source": name, "id_field": "id"}},
        "stages": {"tokenize": {"type": "tokenize", "input": "docs", "tokenizer": tokenizer, "keep_text": False},
                   "pack": {"type": "pack", "input": "tokenize", "seq_len": cfg.seq_len, "algorithm": "best_fit",
                            "shuffle_rows": shuffle, "window": 2000}},
        "output": "pack",
    }
    dag = parse_dag(d, f"<ablate pack {name}>")
    run_dir = (out / "pack" / name).resolve()
    run_dag(dag, run_dir, workers=workers, quiet=True, overwrite=True)
    report = RunDir(run_dir).read_report("pack", PACK_REPORT)
    return run_dir / "pack", {"tokens": int(report["tokens"]), "rows": int(report["rows"])}


_HEADING = re.compile(r"^ = [^=].* = $")


def eval_documents(paths: list[str], text_field: str, max_docs: int | None) -> list[str]:
    """Eval documents for the held-out loss: WikiText-style text split at ` = Title = `
    headings, CoNLL-U at ``# newdoc``, JSONL/Parquet rows as they are."""
    from curation.io.evalsets import base_name, open_text, read_eval_texts

    docs: list[str] = []
    for p in paths:
        base = base_name(Path(p))
        if base.endswith(".conllu"):
            cur: list[str] = []
            with open_text(Path(p)) as f:
                for line in f:
                    if line.startswith("# newdoc") and cur:
                        docs.append(" ".join(cur))
                        cur = []
                    elif line.startswith("# text ="):
                        cur.append(line[len("# text ="):].strip())
            if cur:
                docs.append(" ".join(cur))
        elif base.endswith((".parquet", ".jsonl", ".json", ".ndjson")):
            docs.extend(read_eval_texts(p, text_field))
        else:
            cur = []
            for line in read_eval_texts(p, text_field):
                if _HEADING.match(line) and cur:
                    docs.append("\n".join(cur))
                    cur = []
                cur.append(line.strip())
            if cur:
                docs.append("\n".join(cur))
    docs = [d for d in docs if d.strip()]
    return docs[:max_docs] if max_docs else docs


def build_eval_pack(cfg: AblateConfig, eval_paths: list[str], tokenizer: str, out: Path, workers: int) -> tuple[Path, dict]:
    docs = eval_documents(eval_paths, cfg.eval.text_field, cfg.eval.max_docs)
    d = out / "eval"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "eval_docs.parquet"
    t = pa.table({"id": [f"eval-{i:06d}" for i in range(len(docs))], "text": docs,
                  "source": [cfg.eval.source] * len(docs)})
    if not path.exists() or not pq.read_table(path).equals(t):
        with atomic_path(path) as tmp:
            pq.write_table(t, tmp)
    pack_dir, st = run_pack("eval", [str(path.resolve())], tokenizer, cfg, out, workers, shuffle=False)
    st["docs"] = len(docs)
    return pack_dir, st


def ensure_tokenizer(cfg: AblateConfig, config_dir: Path, decontam_dirs: list[str], out: Path) -> str:
    from curation.tokenizer.model import TokenizerError, model_file, train_tokenizer

    path = Path(_resolve(cfg.tokenizer, config_dir)) if cfg.tokenizer else (out / "tokenizer").resolve()
    with contextlib.suppress(TokenizerError):  # no usable tokenizer there yet: train one
        model_file(path)
        return str(path)
    _log(f"training a {cfg.vocab_size}-token BPE on the decontaminated union of the arms -> {path}")
    train_tokenizer(resolve_corpus(decontam_dirs), path, kind="bpe", vocab_size=cfg.vocab_size, progress=False)
    return str(path)


# ---------------------------------------------------------------------------------------------
# training side


def trainer_config(cfg: AblateConfig, config_dir: Path, tokenizer: str, eval_pack: Path, eval_rows: int,
                   out: Path) -> Path:
    """The one trainer config every run shares (data/run_dir/seed come as --set overrides)."""
    from curation.tokenizer.model import Tokenizer

    tok = Tokenizer.load(tokenizer)
    vocab = int(tok.vocab_size) if hasattr(tok, "vocab_size") else cfg.vocab_size
    vocab = max(vocab, cfg.vocab_size)
    micro = min(cfg.micro_batch, cfg.global_batch)
    batches = cfg.eval.batches or max(1, eval_rows // cfg.global_batch)
    base: dict[str, Any] = {}
    if cfg.model.endswith((".yaml", ".yml")):
        raw = yaml.safe_load(Path(_resolve(cfg.model, config_dir)).read_text())
        for k in ("model", "optim", "schedule"):
            if k in raw:
                base[k] = raw[k]
        base.setdefault("model", {})["vocab_size"] = vocab
    else:
        base["model"] = {"preset": cfg.model, "vocab_size": vocab}
        base["optim"] = {"lr": cfg.lr, "weight_decay": 0.1, "grad_clip": 1.0}
        base["schedule"] = {"kind": "cosine", "warmup_steps": min(cfg.warmup_steps, max(0, cfg.steps - 1))}
    base.update({
        "run_dir": str(out / "train" / "_unset"),
        "seed": 0,
        "data": {"path": str(eval_pack), "seq_len": cfg.seq_len, "pad_id": int(tok.pad_id), "document_mask": True},
        "train": {"global_batch": cfg.global_batch, "micro_batch": micro, "steps": cfg.steps, "device": "cpu",
                  **({"threads": cfg.threads} if cfg.threads else {})},
        "checkpoint": {"every": max(cfg.steps, 1), "keep": 1},
        "metrics": {"every": cfg.eval_every_steps, "tensorboard": False, "progress": "off"},
        # the trainer records time to quality itself: tokens with loss and training seconds at each eval,
        # an extra eval at each budget's step, and both in the run's summary.json
        "eval": {"path": str(eval_pack), "every": cfg.eval_every_steps, "batches": batches,
                 "targets": cfg.targets, "token_budgets": cfg.token_budgets},
    })
    path = out / "train" / "trainer.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def read_eval_curve(run_dir: Path, tokens_per_step: int) -> list[tuple[int, float]]:
    """(tokens seen, eval loss) in step order, last record per step wins (resumes)."""
    pts: dict[int, float] = {}
    mp = run_dir / "metrics.jsonl"
    if not mp.exists():
        return []
    for line in mp.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("kind") == "eval" and r.get("eval_loss") is not None:
            pts[int(r["step"])] = float(r["eval_loss"])
    return [((s + 1) * tokens_per_step, pts[s]) for s in sorted(pts)]


def train_run(trainer_yaml: Path, data: Path, run_dir: Path, seed: int, steps: int, tokens_per_step: int,
              threads: int | None = None) -> list[tuple[int, float]]:
    """Train one (arm, seed); rerunning a finished run only reads its metrics back."""
    import hashlib
    import shutil

    manifest = Path(data) / "_manifest.jsonl"
    key = hashlib.sha256(json.dumps([trainer_yaml.read_text(), manifest.read_text() if manifest.exists() else str(data),
                                     seed, steps, tokens_per_step]).encode()).hexdigest()[:16]
    done = run_dir / "_done.json"
    if done.exists():
        rec = json.loads(done.read_text())
        if rec.get("key") == key:
            return [tuple(x) for x in rec["curve"]]
    if run_dir.exists() and (run_dir / "_key").exists() and (run_dir / "_key").read_text() != key:
        shutil.rmtree(run_dir)  # a run of another config / data: start over
    elif done.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "_key").write_text(key)
    cmd = [sys.executable, "-m", "training", str(trainer_yaml), "--resume", "auto",
           "--set", f"data.path={data}", "--set", f"run_dir={run_dir}", "--set", f"seed={seed}",
           "--set", f"train.steps={steps}"]
    env = dict(os.environ)
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    _log(f"train {run_dir.parent.name} seed {seed}: {steps} steps")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise AblateError(f"training {run_dir} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    curve = read_eval_curve(run_dir, tokens_per_step)
    done.write_text(json.dumps({"key": key, "curve": curve}))
    return curve


# ---------------------------------------------------------------------------------------------
# report


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """First token count at which the (seed-mean) curve is at or below ``target``, linearly
    interpolated between eval points; None if never."""
    prev = None
    for t, l in curve:
        if l <= target:
            if prev is None or prev[1] == l:
                return int(t)
            t0, l0 = prev
            return int(round(t0 + (l0 - target) / (l0 - l) * (t - t0)))
        prev = (t, l)
    return None


def time_to_quality(run_dir: Path, tokens_per_step: int, targets: list[float], budgets: list[float]) -> dict:
    """One run's time to quality from its metrics.jsonl: per target the tokens and wall seconds of
    the first eval at or below it; per budget the eval loss at the first eval whose tokens reach it
    (the trainer evaluates at the step a budget is reached when given ``eval.token_budgets``). None
    where never reached. Tokens and seconds are the trainer's own (``tokens``: training tokens with
    loss, ``wall_s``: training time without evals, over resumes) where its eval records have them;
    else steps x ``tokens_per_step`` and record times since the run's first record."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    t0 = min((r["time"] for r in recs if "time" in r), default=0.0)
    evals: dict[int, dict] = {}
    for r in recs:
        if r.get("kind") == "eval" and r.get("eval_loss") is not None:
            evals[int(r["step"])] = r  # last record per step wins (resumes)
    pts = [(e.get("tokens", (s + 1) * tokens_per_step), float(e["eval_loss"]), e.get("wall_s", e.get("time", t0) - t0))
           for s, e in sorted(evals.items())]
    reached = {f"{t:g}": next(({"tokens": n, "wall_s": round(w, 2)} for n, loss, w in pts if loss <= t), None) for t in targets}
    at_budget = {f"{b:g}": next((loss for n, loss, _ in pts if n >= b), None) for b in budgets}
    return {"targets": reached, "token_budgets": at_budget}


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    common = sorted(set.intersection(*[{t for t, _ in c} for c in curves])) if curves else []
    return [(t, float(np.mean([dict(c)[t] for c in curves]))) for t in common]


def _fmt_tokens(n: float | None) -> str:
    if n is None:
        return "not reached"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def write_report(cfg: AblateConfig, arms: dict[str, dict], out: Path, extra: dict) -> dict:
    base = arms[cfg.baseline]
    base_final = base["final_loss_mean"]
    for a in arms.values():
        a["tokens_to_baseline_final"] = tokens_to_reach(a["mean_curve"], base_final)
    report = {"name": cfg.name, "baseline": cfg.baseline, "config": cfg.model_dump(mode="json"), **extra, "arms": arms}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")

    lines = [f"# Ablation {cfg.name}", "",
             f"Same model ({cfg.model}), {cfg.steps} steps x {cfg.tokens_per_step} tokens = {_fmt_tokens(cfg.steps * cfg.tokens_per_step)} "
             f"training tokens per run, seq_len {cfg.seq_len}, seeds {cfg.seeds}; eval loss on "
             f"{extra['eval']['rows_used']} of {extra['eval']['rows']} packed held-out rows ({extra['eval']['docs']} docs of {', '.join(Path(p).name for p in extra['eval']['paths'])}), "
             f"every {_fmt_tokens(cfg.eval_every_steps * cfg.tokens_per_step)} tokens.", "",
             f"| arm | final eval loss (mean ± std) | tokens to reach {cfg.baseline}'s final loss | epochs | docs kept | tokens kept | docs lost to decontamination |",
             "|---|---|---|---|---|---|---|"]
    for name, a in arms.items():
        lines.append(f"| {name} | {a['final_loss_mean']:.4f} ± {a['final_loss_std']:.4f} | "
                     f"{_fmt_tokens(a['tokens_to_baseline_final'])} | {a['epochs']:.2f} | {a['docs_kept']} | "
                     f"{a['tokens_kept']} | {a['docs_decontaminated']} |")
    lines += ["", "std is over seeds (population std; 0 with one seed). Epochs = training tokens / unique packed tokens of the arm."]
    if cfg.targets or cfg.token_budgets:
        heads = [f"eval loss {t:g}: tokens / wall s" for t in cfg.targets] + [f"loss at {_fmt_tokens(b)} tokens" for b in cfg.token_budgets]
        lines += ["", "Time to quality (mean over seeds; 'not reached' unless every seed reached it). Tokens: training "
                  "tokens with loss, wall s: training time without evals, both as the trainer records them; a budget's "
                  "loss is the eval at the step that reached it:", "",
                  "| arm | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
        for name, a in arms.items():
            q = a["time_to_quality"]
            cells = [("not reached" if (h := q["targets"][f"{t:g}"]) is None else f"{_fmt_tokens(h['tokens'])} / {h['wall_s']:.1f}")
                     for t in cfg.targets]
            cells += [("not reached" if (v := q["token_budgets"][f"{b:g}"]) is None else f"{v:.4f}") for b in cfg.token_budgets]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "report.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, a in arms.items():
        xs = [t for t, _ in a["mean_curve"]]
        ys = [l for _, l in a["mean_curve"]]
        ax.plot(xs, ys, marker="o", ms=3, label=name)
        if len(a["curves"]) > 1:
            lo = [min(dict(c)[t] for c in a["curves"]) for t in xs]
            hi = [max(dict(c)[t] for c in a["curves"]) for t in xs]
            ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out eval loss")
    ax.set_title(f"{cfg.name}: eval loss vs tokens ({len(cfg.seeds)} seed(s))")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "eval_loss.png", dpi=120)
    plt.close(fig)
    return report


# ---------------------------------------------------------------------------------------------
# entry point


def ablate(config_path: str, out: str, workers: int = 2) -> dict:
    """Run the ablation described by ``config_path`` into ``out``; returns the report dict.
    Every step reuses completed work: rerunning after a crash continues."""
    cfg = load_ablate_config(config_path)
    config_dir = Path(config_path).resolve().parent
    out_p = Path(out).resolve()
    out_p.mkdir(parents=True, exist_ok=True)
    eval_paths = [_resolve(p, config_dir) for p in cfg.eval.paths]
    for p in eval_paths:
        if not Path(p).is_file():
            raise AblateError(f"{config_path}: eval.paths: {p} does not exist")

    arms: dict[str, dict] = {}
    decontam_docs: dict[str, list[str]] = {}
    for name, arm in cfg.arms.items():
        spec = arm.dag if isinstance(arm.dag, dict) else _resolve(arm.dag, config_dir)
        shards, st = run_arm(name, spec, out_p, workers)
        docs, st2 = run_decontam(name, shards, cfg, eval_paths, out_p, workers)
        _log(f"arm {name}: {st['docs_curated']} docs curated, {st2['docs_decontaminated']} dropped by decontamination")
        arms[name] = {"dag": arm.dag if isinstance(arm.dag, str) else f"inline: {arm.dag.get('name')}", **st, **st2}
        decontam_docs[name] = docs
    tokenizer = ensure_tokenizer(cfg, config_dir, [str(out_p / "decontam" / n / "decontaminate") for n in cfg.arms], out_p)
    eval_pack, eval_st = build_eval_pack(cfg, eval_paths, tokenizer, out_p, workers)
    if eval_st["rows"] < 1:
        raise AblateError("the eval set packed into no rows")
    trainer_yaml = trainer_config(cfg, config_dir, tokenizer, eval_pack, eval_st["rows"], out_p)
    eval_st["rows_used"] = min(eval_st["rows"], yaml.safe_load(trainer_yaml.read_text())["eval"]["batches"] * cfg.global_batch)
    train_tokens = cfg.steps * cfg.tokens_per_step
    packs = {}
    for name in cfg.arms:
        pack_dir, pst = run_pack(name, decontam_docs[name], tokenizer, cfg, out_p, workers)
        packs[name] = pack_dir
        a = arms[name]
        a["tokens_kept"] = pst["tokens"]
        a["rows"] = pst["rows"]
        a["epochs"] = train_tokens / pst["tokens"] if pst["tokens"] else math.inf
    # Every (arm, seed) is an independent process with its own seed and thread count: several
    # at once give the same curves, sooner (an ablation is arms x seeds small trainings)
    at_once = cfg.trainings_at_once
    _log(f"training {len(cfg.arms) * len(cfg.seeds)} runs ({len(cfg.arms)} arms x {len(cfg.seeds)} seeds), "
         f"{at_once} at once")
    with ThreadPoolExecutor(at_once) as pool:
        runs = {(name, seed): pool.submit(train_run, trainer_yaml, packs[name], out_p / "train" / name / f"seed{seed}",
                                          seed, cfg.steps, cfg.tokens_per_step, cfg.threads)
                for name in cfg.arms for seed in cfg.seeds}
    for name in cfg.arms:
        a = arms[name]
        curves = []
        for seed in cfg.seeds:
            curve = runs[name, seed].result()  # a failed training raises its AblateError here
            if not curve:
                raise AblateError(f"arm {name} seed {seed}: no eval loss recorded")
            curves.append(curve)
        finals = [c[-1][1] for c in curves]
        a["curves"] = curves
        a["final_losses"] = finals
        a["final_loss_mean"] = float(np.mean(finals))
        a["final_loss_std"] = float(np.std(finals))
        a["mean_curve"] = mean_curve(curves)
        if cfg.targets or cfg.token_budgets:
            per_seed = [time_to_quality(out_p / "train" / name / f"seed{seed}", cfg.tokens_per_step, cfg.targets, cfg.token_budgets)
                        for seed in cfg.seeds]
            ttq: dict[str, Any] = {"per_seed": per_seed, "targets": {}, "token_budgets": {}}
            for key in per_seed[0]["targets"]:  # mean over seeds; None unless every seed reached it
                hits = [q["targets"][key] for q in per_seed]
                ttq["targets"][key] = None if None in hits else {f: float(np.mean([h[f] for h in hits])) for f in ("tokens", "wall_s")}
            for key in per_seed[0]["token_budgets"]:
                losses = [q["token_budgets"][key] for q in per_seed]
                ttq["token_budgets"][key] = None if None in losses else float(np.mean(losses))
            a["time_to_quality"] = ttq
        _log(f"arm {name}: final eval loss {a['final_loss_mean']:.4f} ± {a['final_loss_std']:.4f}")
    extra = {"tokenizer": tokenizer, "train_tokens": train_tokens, "steps": cfg.steps,
             "eval": {"paths": eval_paths, **eval_st, "pack": str(eval_pack)}}
    return write_report(cfg, arms, out_p, extra)
