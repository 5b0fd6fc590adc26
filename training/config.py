"""Training configuration: pydantic models loaded from YAML.

Every model forbids unknown keys, so a typo (``optim.lrr``) is an error that names the
file, the dotted field path and, when there is one, the field that was probably meant.
``--set a.b=value`` overrides are applied to the raw YAML before validation, so they get
the same checks.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: Architecture presets. ``vocab_size`` always comes from the config (it belongs to the data).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # ~1-5M parameters depending on vocab; trains on a laptop CPU in minutes.
    "tiny": dict(n_layer=4, d_model=128, n_head=4, n_kv_head=2, ffn_hidden=384),
    # GPT-2-small sized (124M with a 50k vocab).
    "125m": dict(n_layer=12, d_model=768, n_head=12, n_kv_head=4, ffn_hidden=2048),
    # Llama-3.2-1B shape.
    "1b": dict(n_layer=16, d_model=2048, n_head=32, n_kv_head=8, ffn_hidden=8192),
}


class ModelConfig(_Strict):
    """Transformer shape. ``preset`` fills any field left out; explicit fields win."""

    preset: Literal["tiny", "125m", "1b"] | None = None
    vocab_size: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_kv_head: int | None = None  # None = n_head (plain multi-head attention)
    ffn_hidden: int | None = None  # None = 8/3 * d_model rounded up to a multiple of 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    # Document-masked attention backend (training/attention.py). auto: flash > varlen > flex on
    # CUDA, segments on CPU; never a dense T x T mask above 1024 tokens. The choice is logged.
    attention: Literal["auto", "flash", "flex", "varlen", "sdpa", "segments"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in MODEL_PRESETS:
            data = {**MODEL_PRESETS[data["preset"]], **data}
        return data

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.ffn_hidden is None:
            self.ffn_hidden = 64 * math.ceil(8 * self.d_model / 3 / 64)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.d_model // self.n_head) % 2:
            raise ValueError("head dim (d_model / n_head) must be even for RoPE")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


class CurriculumConfig(_Strict):
    """Quality-ordered curriculum inside each source stream (uses the ``quality`` column)."""

    order: Literal["none", "ascending", "bucketed"] = "none"
    buckets: int = Field(default=4, gt=0)  # for "bucketed": quantile buckets, shuffled inside


class SeqLenWarmupConfig(_Strict):
    """Train on shorter chunks of each packed row early on: start, 2*start, ... up to seq_len."""

    start: int = Field(gt=0)
    steps: int = Field(gt=0)


class DataConfig(_Strict):
    """Where the packed shards are and how rows become batches."""

    path: str
    seq_len: int = Field(gt=0)
    pad_id: int = 0
    document_mask: bool = True  # False: plain causal attention across packed documents
    tokenizer: str | None = None  # dir or card file; its content joins the data fingerprint
    allow_data_change: bool = False  # resume even if the shard set changed
    prefetch: int = Field(default=4, ge=1)  # steps prepared ahead on a background thread
    row_group_cache: int = Field(default=32, ge=1)  # decoded row groups kept (raised to 3 shuffle windows per lane)
    # Read order (training/data/order.py). blocks: whole row groups, a seeded block permutation
    # per epoch and a shuffle window of `shuffle_blocks` blocks (bounded reads); rows: a
    # permutation of rows (one block decode per random row once the data outgrows the cache).
    order: Literal["blocks", "rows"] = "blocks"
    shuffle_blocks: int = Field(default=8, ge=1)
    lanes: int = Field(default=1, ge=1)  # block streams; a multiple of the world size: each rank reads only its own
    curriculum: CurriculumConfig = CurriculumConfig()
    seq_len_warmup: SeqLenWarmupConfig | None = None
    # CUDA graphs (train.compile_mode reduce-overhead) with the varlen or flash backend: the most
    # documents one packed row holds, or auto (measured at start from the doc_lens column of every
    # shard, the held-out pack's too: one narrow column read per shard, as the source index reads).
    # Each micro-batch's varlen boundaries are then padded with empty sequences to micro_batch x
    # (this + 1) and max_seqlen is the row length, so every micro-batch has the same shapes and a
    # recorded graph replays (training/static_shapes.py). Required there (refused at start without
    # it); a row holding more stops the run with a DataError naming this field. Unused in every other
    # mode. Memory: flash's backward takes 128 x heads x head_dim x 4 bytes per padded sequence
    # (~400 KB at 125M), transient.
    max_docs_per_row: PositiveInt | Literal["auto"] | None = None

    @model_validator(mode="after")
    def _check_warmup(self) -> DataConfig:
        w = self.seq_len_warmup
        if w is not None:
            ratio = self.seq_len // w.start
            if self.seq_len % w.start or ratio & (ratio - 1):
                raise ValueError(
                    f"seq_len_warmup.start ({w.start}) must be seq_len ({self.seq_len}) / 2^k"
                )
        return self


class OptimConfig(_Strict):
    """AdamW; weight decay applies to matrices only."""

    lr: float = Field(default=3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


Shape = Literal["constant", "linear", "cosine", "sqrt"]


class ScheduleConfig(_Strict):
    """Whole-run LR schedule, used when phases carry no ``lr`` segment of their own.

    cosine: warm-up, then cosine from ``lr`` to ``min_lr_factor * lr`` over the rest.
    wsd:    warm-up, stable at ``lr``, then the last ``decay_fraction`` of steps decays
            (``decay_shape``) to ``min_lr_factor * lr``.
    """

    kind: Literal["cosine", "wsd"] = "cosine"
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_factor: float = Field(default=0.1, ge=0)
    decay_fraction: float = Field(default=0.2, ge=0, le=1)
    decay_shape: Shape = "linear"


class LRSegmentConfig(_Strict):
    """A phase's LR segment: starts where the previous segment ended (the first at ``lr``)."""

    shape: Shape = "constant"
    end_factor: float | None = None  # end LR as a multiple of optim.lr; None = keep the start LR


class PhaseConfig(_Strict):
    """One mixture phase: a length (tokens or steps), per-source weights, an optional LR segment."""

    name: str
    tokens: int | None = Field(default=None, gt=0)
    steps: int | None = Field(default=None, gt=0)
    mix: dict[str, float] | None = None  # None = sources in proportion to their row counts
    lr: LRSegmentConfig | None = None

    @model_validator(mode="after")
    def _one_length(self) -> PhaseConfig:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError(f"phase {self.name!r}: give exactly one of tokens / steps")
        if self.mix is not None:
            if any(w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
                raise ValueError(f"phase {self.name!r}: mix weights must be >= 0 and not all 0")
        return self


class AnnealConfig(_Strict):
    """Defaults for ``--anneal-from CKPT --mix ...`` branches."""

    steps: int | None = Field(default=None, gt=0)
    tokens: int | None = Field(default=None, gt=0)
    shape: Shape = "linear"
    end_factor: float = Field(default=0.0, ge=0)


class TrainLoopConfig(_Strict):
    """Batch geometry and run length. ``global_batch`` is in rows and fixed across world sizes;
    ``batch_tokens`` / ``micro_batch_tokens`` give the same in tokens (whole rows of
    ``data.seq_len``), so a model size can be tuned by tokens per step whatever the row length."""

    global_batch: int | None = Field(default=None, gt=0)
    micro_batch: int | None = Field(default=None, gt=0)  # rows per rank per forward/backward
    batch_tokens: int | None = Field(default=None, gt=0)  # instead of global_batch: rows = batch_tokens / seq_len
    micro_batch_tokens: int | None = Field(default=None, gt=0)  # instead of micro_batch
    steps: int | None = Field(default=None, gt=0)  # used when no phases are given
    tokens: int | None = Field(default=None, gt=0)
    stop_at_step: int | None = Field(default=None, gt=0)  # stop early (checkpointing) e.g. for a preemption drill
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, gt=0)  # torch intra-op threads on CPU
    compile: bool = False  # torch.compile each transformer block (activation checkpointing inside it, FSDP2 hooks outside)
    # torch.compile mode of each block. reduce-overhead replays each block as a CUDA graph: one
    # launch instead of hundreds, for small models whose GPU waits on the host. CUDA graphs need
    # one process without FSDP2/DDP hooks: with strategy auto on one GPU the model is then not
    # wrapped (bf16 autocast, fp32 weights); another strategy is refused. On CPU, CUDA-graph
    # modes fall back to "default" with a note in the run's log.
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    # Deterministic kernels (torch.use_deterministic_algorithms, deterministic flash backward,
    # a fixed cuBLAS workspace): a resumed run then matches the straight run step for step on
    # CUDA too, not only at the first resumed step. Slower (flash backward without atomics).
    deterministic: bool = False
    # Tokens per chunk of the fused LM-head + cross-entropy (training/loss.py): the (tokens x
    # vocab) logits are never materialised in fp32 at once. 0 = one chunk.
    loss_chunk_tokens: int = Field(default=1024, ge=0)
    # Python's garbage collector off during training and run every this many steps (generation
    # 1, as torchtitan does): an automatic collection can land inside any step of any rank, and
    # the other ranks wait for it at the next collective. None: Python's automatic collection.
    gc_every: int | None = Field(default=50, gt=0)


class ParallelConfig(_Strict):
    """How the world's ranks split the work: one device mesh ``(pp, dp_replicate, dp_shard, tp)``.

    ``pp``: pipeline-parallel degree (outermost: the only dimension whose traffic, one activation
    per micro-batch between neighbouring stages, may cross nodes cheaply). The blocks are cut into
    ``pp`` stages of equal counts (``interleaved_1f1b``: ``pp_stages_per_rank`` stages per rank,
    stage ``s`` on rank ``s % pp``); the first stage holds the embedding, the last the norm, the
    head and the loss. ``pp_schedule``: gpipe (every forward, then every backward), 1f1b (one
    forward, one backward: at most ``pp`` micro-batches' activations alive), interleaved_1f1b
    (smaller bubble, more sends). ``pp_microbatches``: the pipeline's micro-batches per step, which
    are the trainer's (global_batch / (micro_batch x data-parallel ranks)); given, it must agree.

    ``tp``: tensor-parallel degree. Each block's attention (q/k/v column-wise, o row-wise: each
    rank holds ``n_head / tp`` heads) and MLP (w1/w3 column-wise, w2 row-wise) are split over
    ``tp`` neighbouring ranks, which read the same rows; the embedding and the LM head are split
    over the vocabulary (tied embeddings stay one tensor; the loss never gathers the logits), the
    norms stay whole. The data-parallel degree is world / (tp x pp).

    ``sequence_parallel`` (with tp > 1; off by default): between the blocks each rank holds only
    seq_len / tp positions of the residual stream, and the norms run on those (Megatron-SP, as
    torchtitan): the norms' and residual's activations ÷ tp for the same traffic (the blocks'
    all-reduces become all-gather + reduce-scatter). Every sequence length must be divisible by tp.
    ``async_tp``: torch's micro-pipelined TP, overlapping those all-gathers and reduce-scatters
    with the matmuls; needs sequence_parallel, train.compile and CUDA (refused at start elsewhere).

    ``strategy`` is the data-parallel one, over the world / tp data-parallel ranks. ``auto``:
    FSDP2 on CUDA at every world size (one GPU: a 1-rank mesh, so one precision recipe whatever
    the world size); on CPU none for one data-parallel rank, DDP above (FSDP2 with tp > 1).

    ``hsdp``: parameters sharded inside groups of ``dp_shard`` data-parallel ranks (default: one
    node, torchrun's LOCAL_WORLD_SIZE / tp) and replicated across ``dp_replicate`` groups:
    all-gathers stay on the node's links, only the gradient all-reduce crosses nodes. (fsdp:
    dp_shard is every data-parallel rank, dp_replicate 1.)"""

    strategy: Literal["auto", "none", "ddp", "fsdp", "hsdp"] = "auto"
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    sequence_parallel: bool = False
    async_tp: bool = False
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    pp_microbatches: int | None = Field(default=None, gt=0)
    pp_stages_per_rank: int = Field(default=2, gt=0)  # interleaved_1f1b only (others: 1)
    dp_shard: int | None = Field(default=None, gt=0)  # ranks sharding parameters (FSDP2)
    dp_replicate: int | None = Field(default=None, gt=0)  # shard groups holding replicas (HSDP)
    shard_size: int | None = Field(default=None, gt=0)  # older name of dp_shard
    # Activation checkpointing per block: full recomputes the block in backward; selective
    # keeps attention outputs and every other matmul (torchtitan's op rule) and recomputes the rest.
    ac: Literal["none", "full", "selective"] = "none"
    activation_checkpointing: bool = False  # older name for ac: full
    # FSDP2 with gradient accumulation: reduce-scatter after every micro-batch (each rank keeps
    # only its gradient shard, torchtitan's choice). false: accumulate unsharded fp32 gradients
    # and reduce once per step (less traffic, the whole model's gradients on every rank).
    reshard_grads_every_microbatch: bool = True
    # FSDP2: free each block's gathered bf16 parameters after its forward and gather them again
    # in backward (torch's default). false keeps them from forward to backward: no second
    # all-gather (on one GPU, a copy and a cast per block), +2 bytes per parameter held.
    reshard_after_forward: bool = True
    # Collective timeouts: the first step (compilation, checkpoint loading) gets timeout_s,
    # later steps step_timeout_s, so a rank that died mid-collective ends the job in minutes.
    timeout_s: float = Field(default=1800, gt=0)
    step_timeout_s: float = Field(default=300, gt=0)

    @model_validator(mode="after")
    def _legacy_ac(self) -> ParallelConfig:
        if self.activation_checkpointing and self.ac == "none":
            self.ac = "full"
        if self.shard_size is not None:
            if self.dp_shard is not None and self.dp_shard != self.shard_size:
                raise ValueError(f"shard_size ({self.shard_size}) and dp_shard ({self.dp_shard}) disagree: give dp_shard only")
            self.dp_shard = self.shard_size
        return self


class CheckpointConfig(_Strict):
    every: int = Field(default=500, gt=0)
    keep: int = Field(default=3, ge=1)
    dir: str | None = None  # default: RUN_DIR/checkpoints
    # dcp.async_save: tensors are staged to host memory and written while training goes on;
    # the checkpoint becomes visible (renamed, `latest`) when the next one starts or the run ends.
    async_save: bool = False
    # Collective timeout around saving and loading (DCP's plan gathers and the rename barriers wait
    # for the slowest writer): its own bound, not parallel.step_timeout_s, which is for a step.
    timeout_s: float = Field(default=1800, gt=0)
    # false: no checkpoint at the run's last step, even when it is a multiple of ``every`` (earlier
    # periodic ones still land). For timed runs (the GPU bench): a save writes 12 bytes per
    # parameter (fp32 weights and two Adam moments; 13.8 GiB at 1B) before the run can end.
    final_save: bool = True


class MetricsConfig(_Strict):
    every: int = Field(default=10, gt=0)
    tensorboard: bool = True  # only if the tensorboard package is importable
    log_row_ids: bool = False  # every consumed row's global id, per rank (for tests / audits)
    progress: Literal["auto", "rich", "plain", "off"] = "auto"
    # Peak FLOP/s of one device for MFU; None = the table in training/metrics.py by device
    # name (CUDA only: on CPU MFU is logged only when this is given). CLI: --peak-flops.
    peak_flops: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _yaml_off(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `off` / `on` as a boolean.
        if isinstance(data, dict) and isinstance(data.get("progress"), bool):
            data = {**data, "progress": "auto" if data["progress"] else "off"}
        return data


class EvalConfig(_Strict):
    """Held-out packed split; ``batches`` counts global batches of ``train.global_batch`` rows,
    taken evenly spaced over the split.

    Time to quality: ``targets`` are held-out losses; the run records the training tokens (with
    loss) and wall seconds at the first eval whose loss is at or below each, and at each of
    ``token_budgets`` (training tokens) it evaluates once more and records the loss there. Both
    land in metrics.jsonl (``kind: quality`` events) and RUN_DIR/summary.json."""

    path: str
    every: int = Field(default=100, gt=0)
    batches: int = Field(default=4, gt=0)
    targets: list[float] = []
    token_budgets: list[float] = []

    @model_validator(mode="after")
    def _sorted(self) -> EvalConfig:
        if any(b <= 0 for b in self.token_budgets):
            raise ValueError(f"token_budgets must be > 0 (got {self.token_budgets})")
        self.targets = sorted(set(self.targets), reverse=True)  # the easiest target is reached first
        self.token_budgets = sorted(set(self.token_budgets))
        return self


class InjectErrorConfig(_Strict):
    """Fault injection for drills and tests: rank ``rank`` raises at step ``step``."""

    step: int = Field(ge=0)
    rank: int = Field(default=0, ge=0)


class GuardConfig(_Strict):
    """Skip steps with a non-finite loss or a grad-norm spike; stop after too many in a row."""

    spike_factor: float = Field(default=10.0, gt=1)  # skip if grad_norm > factor * running median
    window: int = Field(default=100, gt=0)
    min_history: int = Field(default=20, ge=1)  # accepted steps before spike detection starts
    max_consecutive_skips: int = Field(default=5, ge=1)
    # Grad-norm spikes skipped in a row before the guard takes the next one (clipped): when the
    # next batch spikes too, the model moved, not one batch, and skipping cannot repair it
    # (the model stays where it is). Non-finite losses are always skipped.
    max_spike_skips: int = Field(default=1, ge=1)
    inject_nonfinite_steps: list[int] = []  # fault injection for drills/tests: NaN loss at these steps
    inject_error: InjectErrorConfig | None = None  # fault injection: raise on one rank at one step
    # false: no host read of loss / grad norm per step (they are read once per logging
    # interval) and no step is ever skipped; true: one read of both per step, after backward.
    enabled: bool = True


class ProfileConfig(_Strict):
    """Steps ``start`` .. ``start + steps - 1`` under torch.profiler (``training/profiling.py``):
    a Chrome trace and an ops table per rank in ``ranks``, under ``dir`` (default
    RUN_DIR/profile). Step ``start - 1`` is the profiler's warm-up: pick a window after
    compilation (a few steps in)."""

    start: int = Field(ge=1)
    steps: int = Field(default=3, gt=0)
    ranks: list[int] = [0]
    dir: str | None = None
    record_shapes: bool = False  # input shapes per op in the trace (bigger files)
    memory: bool = False  # allocations and frees per op (profile_memory)


class TrainConfig(_Strict):
    """The whole training config (one YAML file)."""

    run_dir: str
    seed: int = 0
    model: ModelConfig
    data: DataConfig
    train: TrainLoopConfig
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    phases: list[PhaseConfig] = []
    anneal: AnnealConfig = AnnealConfig()
    parallel: ParallelConfig = ParallelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    eval: EvalConfig | None = None
    guard: GuardConfig = GuardConfig()
    profile: ProfileConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        t, seq = self.train, self.data.seq_len
        for rows, tokens in (("global_batch", "batch_tokens"), ("micro_batch", "micro_batch_tokens")):
            n_rows, n_tokens = getattr(t, rows), getattr(t, tokens)
            if n_rows is None and n_tokens is None:
                raise ValueError(f"give one of train.{rows} (rows) / train.{tokens}")
            if n_tokens is not None:
                if n_tokens % seq:
                    raise ValueError(f"train.{tokens} ({n_tokens}) must be a multiple of data.seq_len ({seq}): "
                                     "a batch holds whole packed rows")
                if n_rows is not None and n_rows != n_tokens // seq:  # both: a dumped config read back
                    raise ValueError(f"train.{rows} ({n_rows}) and train.{tokens} ({n_tokens}) disagree at seq_len {seq}")
                setattr(t, rows, n_tokens // seq)
        if self.train.global_batch % self.train.micro_batch:
            raise ValueError(
                f"train.global_batch ({self.train.global_batch}) must be a multiple of "
                f"train.micro_batch ({self.train.micro_batch})"
            )
        if not self.phases and (self.train.steps is None) == (self.train.tokens is None):
            raise ValueError("without phases, give exactly one of train.steps / train.tokens")
        if self.phases:
            with_lr = [p.lr is not None for p in self.phases]
            if any(with_lr) and not all(with_lr):
                raise ValueError("either every phase has an lr segment or none has")
            names = [p.name for p in self.phases]
            if len(set(names)) != len(names):
                raise ValueError(f"phase names must be unique, got {names}")
        return self


def _suggest(loc: tuple) -> str:
    """'did you mean' for an unknown key, looking up the model that owns it."""
    model: type[BaseModel] | None = TrainConfig
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return ""
        model = _model_of(field.annotation)
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _format_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid training config"]
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {dotted}: unknown field{_suggest(loc)}")
        elif e["type"] == "missing":
            lines.append(f"  {dotted}: required field is missing")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {dotted}: {msg} (got {e.get('input')!r})" if loc else f"  {msg}")
    return "\n".join(lines)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. optim.lr=1e-3")
        key, value = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = yaml.safe_load(value)
    return raw


def parse_config(raw: dict, source: str = "<config>") -> TrainConfig:
    """Validate a raw dict; errors name ``source`` and the field."""
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(source, err)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file, apply ``--set`` overrides, validate."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    raw = apply_overrides(raw, overrides or [])
    return parse_config(raw, str(path))
