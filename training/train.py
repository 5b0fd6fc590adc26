"""The training loop, and the entry points around it.

``main(config_path, resume, overrides, anneal_from, mix) -> int`` is what the CLI calls;
``run(cfg, ...)`` is the same for an already-loaded config. The loop itself is
``Trainer.fit``: fetch the step's batch (prepared on a background thread), set the LR,
forward/backward each micro-batch (gradient sync only on the last), clip, check the guard
rails, step, log, evaluate, checkpoint.

The loss of a step is the mean over every token that carries loss in the whole global
batch: each micro-batch contributes ``sum(CE) * world / global_token_count`` (DDP and FSDP2
average gradients over ranks, the ``world`` factor undoes that), so the update does not
depend on the world size or on how rows are split into micro-batches. Under pipeline
parallelism (``parallel.pp``) the schedule runs the micro-batches' forwards and backwards
(``training.pipeline_parallel``) with the same scale; the last stage's ranks hold the loss.

Host syncs: none per micro-batch (document boundaries and token counts come from the data
thread, pinned; the global token count, the loss and the grad norm stay on the device). The
guard rails read loss and grad norm once per step, in one transfer, after the last backward
(``guard.enabled: false`` drops that read: the numbers are then read once per logging interval).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from pathlib import Path

import torch

from training import checkpoint as ckpt
from training.config import ConfigError, TrainConfig, load_config
from training.counters import TokenCounts, Window
from training.data import (IGNORE, DataChangedError, DataError, DataOrder, EvalData, PackedDataset, Prefetcher, build_step,
                           order_settings)
from training.guard import Guard
from training.attention import AttentionUnavailable, choose_backend
from training.metrics import MetricsLogger, mfu, mix_table, peak_flops
from training.model import Transformer, flops_per_token
from training.parallel import (
    DistEnv,
    all_reduce_sum,
    clip_grad_norm,
    grad_sync,
    hsdp_shape,
    init_distributed,
    mesh_shape,
    parallelize,
    set_collective_timeout,
    shutdown,
    strategy_for,
    uses_fsdp,
)
from training.files import write_text_atomic
from training.profiling import StepProfiler
from training.pipeline_parallel import check_pp
from training.tensor_parallel import check_tp
from training.quality import TimeToQuality
from training.resume import anneal_record, find_resume_point, resolve_plan
from training.schedule import seq_len_at
from training.static_shapes import boundary_slots, static_docs
from training.trace import TraceWriter

#: Exit code when the guard rails stop a run (too many consecutive skipped steps).
EXIT_GUARD_STOP = 3


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms' scales)."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, fused=device.type == "cuda"
    )


def keeps_grad_buffers(cudagraphs: bool) -> bool:
    """Whether ``.grad`` buffers are allocated once and zeroed in place, never set to None.

    Under CUDA graphs (compile_mode reduce-overhead) a compiled backward returns weight gradients
    in the graph pool; with ``.grad`` None, autograd adopts that pool tensor as ``.grad``, and the
    next micro-batch's graph replay frees or overwrites it (step 0 raises, or the accumulated
    gradient silently becomes the last micro-batch's: pytorch#169545, trainer-audit-s5 C1).
    With ``.grad`` already allocated, autograd adds into it in place instead."""
    return cudagraphs


def allocate_grads(optimizer: torch.optim.Optimizer) -> None:
    """A zero ``.grad`` for every trainable parameter that has none (outside any graph pool)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def parse_mix(text: str) -> dict[str, float]:
    """``web=0.3,math=0.7`` -> {"web": 0.3, "math": 0.7}."""
    out = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--mix {text!r}: expected SOURCE=WEIGHT pairs, e.g. web=0.3,math=0.7") from None
    if not out:
        raise ConfigError("--mix is empty")
    return out


class Trainer:
    """One training run on one process of a (possibly) distributed job."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, resume: str | None = None, anneal_from: str | None = None, mix: dict[str, float] | None = None):
        self.cfg, self.env = cfg, env
        if cfg.train.threads and env.device.type == "cpu":
            torch.set_num_threads(cfg.train.threads)
        self.run_dir = Path(cfg.run_dir)
        gb, micro = cfg.train.global_batch, cfg.train.micro_batch
        # Rows are split over the data-parallel ranks: tensor-parallel peers read the same rows.
        dp = env.dp_world
        if gb % (micro * dp):
            where = (f"world size ({dp})" if env.tp == env.pp == 1
                     else f"data-parallel ranks ({dp} = world {env.world} / (tp {env.tp} x pp {env.pp}))")
            raise ConfigError(f"train.global_batch ({gb}) must be a multiple of train.micro_batch ({micro}) x {where}")
        self.accum = gb // (micro * dp)
        warmup = cfg.data.seq_len_warmup
        check_tp(cfg.model, env.tp, cfg.parallel, (cfg.data.seq_len,) + ((warmup.start,) if warmup else ()),
                 env.device.type, cfg.train.compile)
        check_pp(cfg.model, cfg.parallel, self.accum, cfg.train.compile_mode if cfg.train.compile else None)
        mesh_shape(cfg.parallel, env)  # layout errors now, before any data is read

        curriculum, dc = cfg.data.curriculum.order, cfg.data
        # Decoded blocks kept: at least three shuffle windows per lane this rank reads (sources
        # walk a lane's windows at their own pace, and wrap their epochs at different steps).
        cache = max(dc.row_group_cache, 3 * dc.shuffle_blocks * -(-dc.lanes // dp))
        self.dataset = PackedDataset(dc.path, dc.tokenizer, cache, need_quality=curriculum != "none")
        self.notes: list[str] = []
        if curriculum != "none" and not self.dataset.has_quality:
            self.notes.append("curriculum asked for but the shards have no 'quality' column: using a plain shuffle")
            curriculum = "none"
        if curriculum != "none" and dc.order == "blocks":
            self.notes.append("a quality curriculum orders single rows: reads are per row, not per block")
        order_kw = dict(order=dc.order, window=dc.shuffle_blocks, lanes=dc.lanes)

        # Where the run starts and the plan from there. Is the checkpoint's data order still
        # this data's? That is checked first: the answer decides which plan applies.
        self.checkpointer = ckpt.Checkpointer(cfg.checkpoint.dir or self.run_dir / "checkpoints", cfg.checkpoint.keep, env,
                                            async_save=cfg.checkpoint.async_save, timeout_s=cfg.checkpoint.timeout_s)
        point = find_resume_point(self.checkpointer, resume, anneal_from)
        data_changed = point.check_data(self.dataset, cfg, order_settings(dc.order, curriculum, dc.shuffle_blocks, dc.lanes))
        self.plans, self.schedule = resolve_plan(cfg, point, self.dataset.source_rows(), data_changed, mix, self.dataset.source_tokens())
        self.order = DataOrder(self.dataset, self.plans, cfg.seed, gb, curriculum, cfg.data.curriculum.buckets, **order_kw)

        self._build_model()

        # The training state besides model and optimizer, by its key in a checkpoint's meta.
        self.guard = Guard(cfg.guard)
        self.quality = TimeToQuality(cfg.eval.targets, cfg.eval.token_budgets) if cfg.eval else TimeToQuality([], [])
        self.tokens = TokenCounts(self.dataset.sources)  # non-padding tokens, by the row's source
        self.content_tokens = TokenCounts()  # by the documents' own sources (rows' source_tokens)
        self.components = {
            "data": self.order, "plans": self.plans, "schedule": self.schedule, "guard": self.guard,
            "tokens_by_source": self.tokens, "content_tokens_by_source": self.content_tokens,
            "time_to_quality": self.quality,
        }
        if point.path is not None:
            set_collective_timeout(env, cfg.checkpoint.timeout_s)  # loading is checkpoint I/O
            ckpt.load(point.path, self.model, self.optimizer, env, point.restored(self.components))
            set_collective_timeout(env, cfg.parallel.timeout_s)
        self.start_step, self.lineage = point.step, point.lineage(mix)

        total = self.order.total_steps
        self.end_step = min(total, cfg.train.stop_at_step) if cfg.train.stop_at_step else total
        self.metrics = MetricsLogger(
            self.run_dir, env.rank, env.world, total, self.start_step, cfg.metrics.progress, cfg.metrics.tensorboard, cfg.metrics.log_row_ids
        )
        # Each step's global row ids (rank 0), made durable with every checkpoint: training/trace.py.
        self.trace = TraceWriter(self.run_dir, self.start_step, self.dataset, enabled=env.rank == 0)
        self.eval_data = None
        if cfg.eval is not None:
            self.eval_data = EvalData(
                cfg.eval.path, cfg.eval.batches, gb, micro, env.dp_rank, env.dp_world, cfg.data.seq_len,
                cfg.data.document_mask, cfg.data.pad_id, cfg.model.vocab_size, self.max_docs,
            )
        self.peak = peak_flops(env.device, cfg.metrics.peak_flops)
        self.pin = env.device.type == "cuda"
        self.profiler = StepProfiler(cfg.profile, self.run_dir, env.rank, env.device, self.start_step, self.metrics.log)

    def _build_model(self) -> None:
        """The attention backend, the model (sharded, compiled, initialised), its optimizer and the
        compile mode's consequences: kept ``.grad`` buffers and fixed varlen shapes under CUDA graphs."""
        cfg, env = self.cfg, self.env
        # The attention backend, resolved once for the longest rows (logged at start).
        try:
            backend, self.attention_why = choose_backend(cfg.model.attention, env.device, cfg.data.seq_len, cfg.data.document_mask)
        except AttentionUnavailable as err:
            raise ConfigError(f"model.attention: {err}") from None
        self.attention = backend
        # Built on the meta device (no memory, no init), then sharded, compiled and
        # initialised by parallelize: under FSDP2 each rank allocates and initialises only its
        # own shards. The init depends on (seed, parameter name) only: the same weights on
        # any world size.
        torch.manual_seed(cfg.seed)
        with torch.device("meta"):
            model = Transformer(cfg.model.model_copy(update={"attention": backend}), cfg.data.seq_len, init_seed=cfg.seed)
        self.n_params = model.num_params()
        self.n_matmul = model.num_params(matmul_only=True)
        self.notes += env.notes
        self.compile_mode = compile_mode_for(cfg, env, self.notes)
        self.cudagraphs = cfg.train.compile and self.compile_mode in CUDAGRAPH_MODES
        self.static_grads = keeps_grad_buffers(self.cudagraphs)
        # A CUDA graph replays only inputs of the shapes it recorded: varlen boundaries of one length.
        self.max_docs = static_docs(cfg, backend, self.cudagraphs)
        if self.max_docs == "auto":  # the held-out rows go through the same graphs
            held = [PackedDataset(cfg.eval.path).max_docs_per_row()] if cfg.eval else []
            self.max_docs = max([self.dataset.max_docs_per_row(), *held])
        if self.max_docs is not None:
            slots = boundary_slots(cfg.train.micro_batch, cfg.data.seq_len, cfg.data.seq_len, self.max_docs)
            self.notes.append(f"CUDA graphs: varlen boundaries padded to {slots} sequences per micro-batch "
                              f"(data.max_docs_per_row {self.max_docs}), max_seqlen = the row length: one shape, graphs replay")
        self.model = parallelize(model, cfg.parallel, env, compile=cfg.train.compile, compile_mode=self.compile_mode)
        self.optimizer = build_optimizer(self.model, cfg, env.device)
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if env.device.type == "cuda" and not uses_fsdp(self.model)
            else contextlib.nullcontext()
        )

    # -- the loop -------------------------------------------------------------------------

    def _make_step(self, step: int):
        """Runs on the prefetch thread: this rank's rows for ``step``, ready to train on."""
        cfg, env = self.cfg, self.env
        rows = self.order.step_rows(step)
        batch = build_step(
            self.dataset, rows[env.dp_rank :: env.dp_world], step, cfg.data.seq_len, seq_len_at(cfg, step), cfg.train.micro_batch,
            cfg.data.document_mask, cfg.data.pad_id, cfg.model.vocab_size, self.max_docs,
        )
        batch.global_rows = rows
        # Summed over every rank: one rank of each data-parallel rank's (pp x tp) group counts its rows.
        batch.counts = torch.tensor([batch.n_tokens if env.counts_rows else 0], dtype=torch.float64)
        if self.pin:  # page-locked here, so the loop's copies to the GPU are asynchronous
            batch.micro = [mb.pin() for mb in batch.micro]
            batch.counts = batch.counts.pin_memory()
        return batch

    def _loss_sum(self, mb) -> torch.Tensor:
        """Summed cross-entropy of one micro-batch (fp32 scalar on the device)."""
        with self.autocast:
            return self.model(mb.inputs, mb.doc_ids, mb.positions, targets=mb.targets, cu_seqlens=mb.cu_seqlens,
                              max_seqlen=mb.max_seqlen, loss_chunk_tokens=self.cfg.train.loss_chunk_tokens)

    def train_step(self, step: int, batch) -> tuple[float | torch.Tensor, float | torch.Tensor, str | None]:
        """Forward/backward over the micro-batches, clip, guard, step. Returns (loss, grad
        norm, skip reason): floats with the guard on; device tensors with it off (read them
        when logging)."""
        env, dev, guard_cfg = self.env, self.env.device, self.cfg.guard
        lr = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if guard_cfg.inject_error is not None and (guard_cfg.inject_error.step, guard_cfg.inject_error.rank) == (step, env.rank):
            raise RuntimeError(f"injected error on rank {env.rank} at step {step} (guard.inject_error)")
        if self.static_grads:
            # At the first step, not at build: DCP's optimizer-state init (checkpoint load) runs
            # only while every .grad is None, and leaves them None. Later steps find them allocated.
            allocate_grads(self.optimizer)
        n_global = all_reduce_sum(batch.counts.to(dev, non_blocking=True), env)[0]  # stays on the device
        scale = (env.dp_world / n_global.clamp(min=1)).float()
        loss_sum = torch.zeros((), dtype=torch.float32, device=dev)
        last = len(batch.micro) - 1
        self.n_step = n_global  # the step's global tokens with loss (time to quality counts them)
        pipeline = getattr(self.model, "pipeline", None)
        if pipeline is not None:  # the schedule runs every micro-batch's forward and backward
            pipeline.poison = step in guard_cfg.inject_nonfinite_steps
            with self.autocast:
                loss_sum += pipeline.step([mb.to(dev) for mb in batch.micro], scale, self.cfg.train.loss_chunk_tokens)
        for i, mb in enumerate(batch.micro if pipeline is None else []):
            mb = mb.to(dev)
            if self.cudagraphs:  # a new iteration: the graphs' previous outputs may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            with grad_sync(self.model, i == last):
                ce = self._loss_sum(mb)
                if step in guard_cfg.inject_nonfinite_steps:
                    ce = ce * float("nan")  # fault injection: a poisoned batch
                (ce * scale).backward()
            loss_sum += ce.detach()
        if env.tp_rank:  # tensor-parallel peers computed the same loss: one of them counts it
            loss_sum.zero_()
        # (pipeline: only the last stage's ranks have a loss, the others' is 0)
        loss = all_reduce_sum(loss_sum.double(), env) / n_global
        grad_norm = clip_grad_norm(self.model, self.cfg.optim.grad_clip)
        if not guard_cfg.enabled:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=not self.static_grads)
            return loss, grad_norm, None
        loss, grad_norm, n = torch.stack([loss, grad_norm.double(), n_global]).tolist()  # the step's one host read
        self.n_step = n
        reason = "no tokens with loss in the global batch" if n == 0 else self.guard.verdict(loss, grad_norm)
        if reason is None:
            self.optimizer.step()
            self.guard.accept(grad_norm)
        self.optimizer.zero_grad(set_to_none=not self.static_grads)
        return loss, grad_norm, reason

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per token over the held-out split (all ranks)."""
        self.model.eval()
        dev = self.env.device
        acc = torch.zeros(2, dtype=torch.float64, device=dev)
        pipeline = getattr(self.model, "pipeline", None)
        for mb in self.eval_data.micro:
            mb = mb.to(dev)
            if pipeline is None:
                acc[0] += self._loss_sum(mb).double()
            else:
                with self.autocast:
                    acc[0] += pipeline.eval(mb, self.cfg.train.loss_chunk_tokens).double()
            acc[1] += (mb.targets != IGNORE).sum()
        if pipeline is not None and not pipeline.has_last:  # the loss and its tokens from the last stage only
            acc.zero_()
        self.model.train()
        acc = all_reduce_sum(acc, self.env)
        return float(acc[0] / acc[1].clamp(min=1))

    def save(self, step: int, reason: str) -> Path:
        """Checkpoint after ``step`` completed steps (collective)."""
        info = {"config": self.cfg.model_dump(mode="json"), "reason": reason}
        if (anneal := anneal_record(self.lineage)) is not None:
            info["anneal"] = anneal
        self.trace.flush()  # before the checkpoint: every step it covers is traceable
        if self.static_grads and not self.optimizer.state:
            # No step taken yet (a guard stop): DCP initialises Adam's state for the checkpoint
            # only when no .grad exists; the next step allocates them again.
            self.optimizer.zero_grad(set_to_none=True)
        # Checkpoint I/O has its own collective timeout (a large save on slow storage is not a hung step).
        set_collective_timeout(self.env, self.cfg.checkpoint.timeout_s)
        path = self.checkpointer.save(step, self.model, self.optimizer, self.components, info)
        set_collective_timeout(self.env, self.cfg.parallel.step_timeout_s)
        # Logged under the last completed step (like train records), so a resume from this
        # checkpoint keeps the event when it trims records of steps it will redo.
        self.metrics.log({"kind": "event", "step": step - 1, "event": "checkpoint", "message": f"checkpoint {path.name} ({reason})"})
        return path

    def _gather_content(self, local: dict[str, int]) -> dict[str, int]:
        if not self.env.distributed:
            return local
        import torch.distributed as dist

        parts: list = [None] * self.env.world
        dist.all_gather_object(parts, local)
        out: dict[str, int] = {}
        for part in parts:
            for k, v in part.items():
                out[k] = out.get(k, 0) + v
        return out

    def fit(self) -> int:
        """Train from ``start_step`` to the end (or ``stop_at_step``). Returns an exit code."""
        cfg, env, m = self.cfg, self.env, self.metrics
        self._log_start()
        if self.start_step >= self.end_step:
            m.log({"kind": "event", "step": self.start_step, "event": "done", "message": "nothing to do: already at the final step"})
            m.close()
            return 0

        prefetch = Prefetcher(self._make_step, self.start_step, self.end_step, cfg.data.prefetch)
        window = Window(len(self.dataset.sources))
        code = 0
        gc_every, gc_was_enabled = cfg.train.gc_every, gc.isenabled()
        if gc_every:  # collections at step boundaries only (restored when the loop ends)
            gc.disable()
            gc.collect(1)
        sync = env.device.type == "cuda"
        self.quality.start()
        try:
            for step in range(self.start_step, self.end_step):
                t0 = time.perf_counter()
                with self.profiler.step_range(step):
                    batch = prefetch.get()
                    t_data = time.perf_counter()
                    loss, grad_norm, reason = self.train_step(step, batch)
                if sync and ((step + 1) % cfg.metrics.every == 0 or step + 1 == self.end_step):
                    # A logging window ends here: its time includes the work still queued on the
                    # device (without this, tokens/s and MFU leave the backlog out).
                    torch.cuda.synchronize(env.device)
                t_end = time.perf_counter()
                self.quality.add(self.n_step)
                self.profiler.after_step(step)
                if step == self.start_step:  # compiled and loaded: later steps take seconds
                    set_collective_timeout(env, cfg.parallel.step_timeout_s)
                m.rows(step, batch.row_ids)
                self.trace.add(step, batch.global_rows)
                window.add(batch, loss, grad_norm, reason, t_data - t0, t_end - t0)
                stop = self._guard_events(step, loss, grad_norm, reason)

                done = step + 1
                self.order.step = done  # the data position a checkpoint records
                if gc_every and done % gc_every == 0:
                    gc.collect(1)
                if done % cfg.metrics.every == 0 or done == self.end_step or stop:
                    self._log_window(step, window)
                    window = Window(len(self.dataset.sources))
                else:
                    m.progress(done)
                self._evaluate_if_due(step, done)
                if stop:
                    code = self._stop_by_guard(step, done, reason)
                    break
                at_end = done == self.end_step
                # checkpoint.final_save false: the run ends without a save, even on a periodic step
                if cfg.checkpoint.final_save if at_end else done % cfg.checkpoint.every == 0:
                    self.save(done, "end" if at_end else "periodic")
            # An async save still writing becomes visible before we exit; its barrier waits for the
            # slowest writer, so under the checkpoint's timeout, not a step's.
            set_collective_timeout(env, cfg.checkpoint.timeout_s)
            self.checkpointer.wait()
            self.quality.pause()
            self._write_summary(code)
        finally:
            if gc_every and gc_was_enabled:
                gc.enable()
            self.profiler.close()  # a run that stopped inside the window writes what it recorded
            prefetch.close()
            self.trace.close()
            m.close()
        if code == 0 and self.env.rank == 0 and self.end_step == self.order.total_steps and self.cfg.metrics.progress != "off":
            print("realised mix (weights are shares of content tokens):\n" + mix_table(self.run_dir, self.plans), flush=True)
        return code

    def _log_start(self) -> None:
        """The run's start event (model, mesh, batches, steps, phases, kernels) and its notes."""
        cfg, env = self.cfg, self.env
        strategy = strategy_for(cfg.parallel, env)
        if strategy == "hsdp":
            strategy += " {}x{}".format(*hsdp_shape(cfg.parallel, env))
        if env.tp > 1:
            strategy += f", tp {env.tp}" + (" sequence-parallel" if cfg.parallel.sequence_parallel else "") \
                + (" async" if cfg.parallel.async_tp else "")
        if env.pp > 1:
            strategy += f", pp {env.pp} {cfg.parallel.pp_schedule}"
        self.metrics.log({
            "kind": "event", "step": self.start_step, "event": "start",
            "message": (
                f"{self.n_params / 1e6:.2f}M params, world {env.world} ({strategy}), device {env.device}, "
                f"{self.accum} micro-batch(es) of {cfg.train.micro_batch} rows per rank, "
                f"steps {self.start_step}->{self.end_step} of {self.order.total_steps}, "
                f"phases {[(p.name, p.start, p.end) for p in self.plans]}, "
                f"attention {self.attention} ({self.attention_why})"
                + ((f", compiled ({self.compile_mode})" if self.compile_mode != "default" else ", compiled") if cfg.train.compile else "")
                + (f", activation checkpointing ({cfg.parallel.ac})" if cfg.parallel.ac != "none" else "")
                + (", deterministic" if cfg.train.deterministic else "")
                + (f", peak {self.peak / 1e12:g} TFLOP/s per device" if self.peak else "")
            ),
            "lineage": self.lineage, "fingerprint": self.dataset.fingerprint,
            "attention": self.attention, "attention_reason": self.attention_why,
            "compile": cfg.train.compile, "compile_mode": self.compile_mode if cfg.train.compile else None,
            "activation_checkpointing": cfg.parallel.ac, "deterministic": cfg.train.deterministic,
            "flops_per_token": flops_per_token(cfg.model, cfg.data.seq_len, self.n_matmul), "peak_flops": self.peak,
        })
        for note in self.notes:
            self.metrics.log({"kind": "event", "step": self.start_step, "event": "note", "message": note})

    def _guard_events(self, step: int, loss, grad_norm, reason: str | None) -> bool:
        """Log what the guard did at this step (a spike taken, a step skipped); True when the
        skips in a row reached the guard's limit and the run must stop."""
        stop = False
        if self.guard.note is not None:
            self.metrics.log({"kind": "event", "step": step, "event": "spike_taken", "loss": loss,
                              "grad_norm": grad_norm, "message": f"step {step}: {self.guard.note}"})
        if reason is not None:
            stop = self.guard.reject()
            self.metrics.log({"kind": "event", "step": step, "event": "skip", "loss": loss, "grad_norm": grad_norm,
                              "message": f"skipped step {step}: {reason} ({self.guard.consecutive} in a row)"})
        return stop

    def _evaluate_if_due(self, step: int, done: int) -> None:
        """The held-out loss every ``eval.every`` steps, at the end and at each token budget;
        eval time is not counted as training time."""
        if self.eval_data is None:
            return
        m = self.metrics
        budget = self.quality.budget_due()
        if not (done % self.cfg.eval.every == 0 or done == self.end_step or budget is not None):
            return
        self.quality.pause()
        loss_eval = self.evaluate()
        tokens_seen, wall = self.quality.read()
        m.log({"kind": "eval", "step": step, "eval_loss": loss_eval, "tokens": tokens_seen, "wall_s": round(wall, 3)})
        for ev in self.quality.on_eval(step, loss_eval, budget):
            m.log({"kind": "event", "step": step, **ev})
        while (budget := self.quality.budget_due()) is not None:  # several budgets inside one step
            for ev in self.quality.on_eval(step, loss_eval, budget):
                m.log({"kind": "event", "step": step, **ev})
        self.quality.start()

    def _stop_by_guard(self, step: int, done: int, reason: str | None) -> int:
        """Too many skipped steps in a row: save, say why, and end with the guard's exit code."""
        self.save(done, "guard stop")
        self.metrics.log({"kind": "event", "step": step, "event": "stop", "message": (
            f"stopping: {self.guard.consecutive} consecutive skipped steps "
            f"(guard.max_consecutive_skips={self.cfg.guard.max_consecutive_skips}); "
            f"last reason: {reason}. Checkpoint saved; inspect the data around step {step} "
            "or lower the LR before resuming.")})
        return EXIT_GUARD_STOP

    def _write_summary(self, code: int) -> None:
        """RUN_DIR/summary.json (rank 0): what the run reached, for reports (``refinery ablate``)."""
        summary = self.quality.summary()  # every rank: it may read a device count
        if not self.env.is_main:
            return
        evals = [r for r in map(json.loads, (self.run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "eval"]
        out = {"exit": code, "step": self.order.step, "total_steps": self.order.total_steps,
               "tokens": summary["tokens"], "wall_s": summary["wall_s"],
               "final_eval_loss": evals[-1]["eval_loss"] if evals else None,
               "attention": self.attention, "compile": self.cfg.train.compile, "compile_mode": self.compile_mode,
               "time_to_quality": {"targets": summary["targets"], "token_budgets": summary["token_budgets"]}}
        write_text_atomic(self.run_dir / "summary.json", json.dumps(out, indent=1) + "\n")

    def _log_window(self, step: int, w: Window) -> None:
        env = self.env
        # One collective for every per-interval counter: tokens by source, then wall times.
        counted = env.counts_rows  # tensor-parallel peers and pipeline stages read the same rows: one counts them
        stats = torch.tensor([n if counted else 0 for n in w.by_source] + [w.data_time, w.step_time], dtype=torch.float64,
                             device=env.device)
        stats = all_reduce_sum(stats, env).cpu().numpy()
        by_source = {s: float(n) for s, n in zip(self.dataset.sources, stats[:-2])}
        self.tokens.add(by_source)
        content = self._gather_content(w.content if counted else {})
        self.content_tokens.add(content)
        data_time, step_time = stats[-2] / env.world, stats[-1] / env.world
        tokens = float(stats[:-2].sum())
        tps = tokens / max(step_time, 1e-9)
        fpt = flops_per_token(self.cfg.model, w.seq_len, self.n_matmul)
        fpt_causal = flops_per_token(self.cfg.model, w.seq_len, self.n_matmul, causal=True)
        phase = self.plans[self.order.phase_index(step)].name
        self.metrics.log({
            "kind": "train", "step": step, "phase": phase,
            "loss": float(w.loss_sum / w.accepted) if w.accepted else float("nan"),
            "loss_step": float(w.last_loss), "grad_norm": float(w.last_grad_norm), "lr": self.schedule(step),
            "seq_len": w.seq_len, "steps": w.steps, "skipped": w.skipped,
            "tokens": tokens, "tokens_per_s": tps,
            "mfu": mfu(fpt, tps, self.peak, env.world),
            "mfu_causal": mfu(fpt_causal, tps, self.peak, env.world),  # attention FLOPs of the causal half only
            "data_wait_frac": data_time / max(step_time, 1e-9),
            # bytes decoded per byte handed to training so far (this rank's reads)
            "read_amplification": self.dataset.read_stats()["read_amplification"],
            "tokens_by_source": by_source,
            "tokens_seen_by_source": self.tokens.state_dict(),
            "content_tokens_by_source": content,
        })


def run(cfg: TrainConfig, resume: str | None = None, anneal_from: str | None = None, mix: dict[str, float] | None = None) -> int:
    """Train with an already-validated config (in this process / torchrun rank). Returns an exit code."""
    cfg = cfg.model_copy(update={"parallel": parallel_for_compile(cfg)})
    # Deterministic mode is process-global: restored after this run (tests, a service training
    # in-process), so the next run gets what its own config says.
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    env = init_distributed(cfg.train.device, cfg.parallel, cfg.train.deterministic)
    clean = False
    try:
        code = Trainer(cfg, env, resume, anneal_from, mix).fit()
        clean = True
        return code
    finally:
        # After an error: no barrier (the other ranks may be inside a collective this rank
        # will never join); the group is aborted and the error goes on up.
        shutdown(env, clean=clean)
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


#: torch.compile modes that replay CUDA graphs.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def parallel_for_compile(cfg: TrainConfig):
    """CUDA graphs (``compile_mode`` reduce-overhead / max-autotune) cannot capture FSDP2's or
    DDP's hooks: on one process ``strategy: auto`` then means no wrapper (bf16 autocast)."""
    import os

    p = cfg.parallel
    if (cfg.train.compile and cfg.train.compile_mode in CUDAGRAPH_MODES and p.strategy == "auto"
            and int(os.environ.get("WORLD_SIZE", "1")) == 1):
        return p.model_copy(update={"strategy": "none"})
    return p


def compile_mode_for(cfg: TrainConfig, env, notes: list[str]) -> str:
    """The compile mode this run uses: CUDA-graph modes fall back to default on CPU (noted), and
    are refused with a data-parallel wrapper (its hooks cannot be captured in a graph)."""
    mode = cfg.train.compile_mode
    if not cfg.train.compile or mode not in CUDAGRAPH_MODES:
        return mode
    if env.device.type != "cuda":
        notes.append(f"train.compile_mode {mode}: CUDA graphs need a CUDA device; compiling with mode default on {env.device.type}")
        return "default"
    strategy = strategy_for(cfg.parallel, env)
    if strategy != "none":
        raise ConfigError(f"train.compile_mode {mode} (CUDA graphs) cannot capture {strategy}'s hooks: use it on one "
                          "process with parallel.strategy none or auto, or compile_mode max-autotune-no-cudagraphs")
    if env.pp > 1:
        raise ConfigError(f"train.compile_mode {mode} (CUDA graphs) with parallel.pp > 1 is not supported: the "
                          "schedule's sends and receives run between the graphs; use compile_mode default")
    if env.tp > 1:  # not tried: TP's collectives inside captured graphs
        raise ConfigError(f"train.compile_mode {mode} (CUDA graphs) with parallel.tp > 1 is not supported: "
                          "use compile_mode default or max-autotune-no-cudagraphs")
    return mode


def main(
    config_path: str,
    resume: str | None = None,
    overrides: list[str] | None = None,
    anneal_from: str | None = None,
    mix: str | None = None,
) -> int:
    """CLI entry: ``refinery train CONFIG`` / ``python -m training CONFIG``.

    resume:      None or "auto" = continue from RUN_DIR's latest checkpoint if there is one;
                 "never" = start fresh (refused if RUN_DIR has checkpoints); a path = that checkpoint.
    overrides:   ``["optim.lr=1e-3", "train.stop_at_step=100"]`` (values parsed as YAML).
    anneal_from: a stable-phase checkpoint to branch an annealing phase from (needs ``mix``,
                 and anneal.steps/tokens; use a new run_dir).
    mix:         ``"web=0.3,math=0.7"`` source weights of the annealing phase.
    Returns 0 on success, 2 for a config/data error (message on stderr), 3 when the guard
    rails stopped the run.
    """
    try:
        cfg = load_config(config_path, overrides)
        if anneal_from and not mix:
            raise ConfigError("--anneal-from needs --mix SOURCE=WEIGHT,... for the annealing phase")
        return run(cfg, resume, anneal_from, parse_mix(mix) if mix else None)
    except (ConfigError, DataError, DataChangedError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
