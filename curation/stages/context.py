"""What a global stage's ``run(ctx)`` may ask of the pipeline: the stage layer's side of the
contract, as Protocols. ``curation.pipeline.context.GlobalContext`` implements them; a stage
never sees the run directory's layout or the DAG class, so the stage layer imports nothing
from the pipeline, not even for types.

A global stage reads as a list of resumable phases::

    if ctx.finished(keys, REPORT):        # committed every shard and wrote its report before
        return
    counts = ctx.phase("count", count_task, [CountJob(path) for _, path in ctx.upstream], fold=merge)
    ctx.phase("apply", apply_task, [ApplyJob(ctx.output(key), ...) for key, _ in ctx.upstream], commit=True)
    ctx.write_report(REPORT, {...})

A job is a frozen dataclass; a commit phase's jobs carry ``out = ctx.output(key)`` (a
``ShardSink``), through which their tasks write and which returns the manifest entry, or
``outs`` (several sinks: a task writing several shards returns the list of their entries).

A task whose block of upstream shards may share outputs (``curation.io.shards.output_groups``)
writes through ``GroupedOutputs``: shard by shard, each group's shards appended to one file.

Of the stage layer this module imports nothing: ``curation.stages.base`` refers to it, not the
other way round (a stage and ``Resources`` appear here as ``Any``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from curation.io.shards import output_groups

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa


class ShardSink(Protocol):
    """Where one task of a global stage writes its output shard ``key`` (picklable: it travels
    in the task's job)."""

    stage: str
    params_hash: str
    key: str

    def write(self, kept: pa.Table | None, rejected: pa.Table | None, rows_in: int, **kwargs: Any) -> dict:
        """Write the shard (and its rejections); return its manifest entry."""
        ...

    def open(self) -> ShardAppender:
        """The shard written part by part (several upstream shards into one output)."""
        ...


class ShardAppender(Protocol):
    def append(self, kept: pa.Table | None, rejected: pa.Table | None, rows_in: int) -> None: ...

    def close(self, **extra: Any) -> dict:
        """Put the files in place; the manifest entry (``extra`` keys added)."""
        ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class GroupedOutputs:
    """The outputs of one block task: ``sinks[g]`` receives the block's shards up to (not
    including) ``ends[g]``, counted from the block's first shard. One output per shard when
    every group holds one (``ends == (1, 2, ...)``). Iterates over its sinks, so a job holds
    it as its ``outs`` (what a commit phase looks for)."""

    sinks: tuple[ShardSink, ...]
    ends: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sinks) != len(self.ends) or list(self.ends) != sorted(set(self.ends)):
            raise ValueError(f"GroupedOutputs: {len(self.sinks)} outputs for group ends {self.ends}")

    def __iter__(self):
        return iter(self.sinks)

    def __len__(self) -> int:
        return len(self.sinks)

    @property
    def stage(self) -> str:
        return self.sinks[0].stage

    def writer(self) -> GroupWriter:
        return GroupWriter(self)


def block_outputs(ctx: StageContext, keys: Sequence[str], sizes: list[int],
                  spans: list[tuple[int, int]]) -> list[GroupedOutputs]:
    """Per block ``[lo, hi)`` of the upstream, its outputs (``output_groups``: small shards
    share one), each a sink of ``ctx`` under its first shard's key."""
    out = []
    for lo, hi in spans:
        groups = output_groups(sizes, (lo, hi))
        out.append(GroupedOutputs(tuple(ctx.output(keys[a]) for a, _ in groups), tuple(b - lo for _, b in groups)))
    return out


def output_keys(outputs: Sequence[GroupedOutputs]) -> list[str]:
    """The keys a stage writing ``outputs`` commits (what ``ctx.finished`` waits for)."""
    return [o.key for g in outputs for o in g]


class GroupWriter:
    """Feed it the block's shards in order (``add``); ``entries`` are the finished outputs'
    manifest entries. Integer ``counts`` given per shard are summed into the entry."""

    def __init__(self, groups: GroupedOutputs):
        self.groups = groups
        self.entries: list[dict] = []
        self._shard = 0
        self._open: ShardAppender | None = None
        self._counts: dict[str, int] = {}

    def add(self, kept: pa.Table | None, rejected: pa.Table | None, rows_in: int, **counts: int) -> None:
        g = len(self.entries)
        if g >= len(self.groups):
            raise IndexError(f"GroupWriter: shard {self._shard} is past the block's last group")
        if self._open is None:
            self._open = self.groups.sinks[g].open()
        try:
            self._open.append(kept, rejected, rows_in)
        except BaseException:
            self._open.abort()
            raise
        for k, v in counts.items():
            self._counts[k] = self._counts.get(k, 0) + int(v)
        self._shard += 1
        if self._shard == self.groups.ends[g]:
            self.entries.append(self._open.close(**self._counts))
            self._open, self._counts = None, {}

    def done(self) -> list[dict]:
        """The entries, every group written (a shard missing is a bug: said, not hidden)."""
        if len(self.entries) != len(self.groups):
            if self._open is not None:
                self._open.abort()
            raise RuntimeError(f"GroupWriter: {self._shard} shards fed, groups end at {self.groups.ends}")
        return self.entries


class RunSource(Protocol):
    """The run a stage's input comes from, read-only: a node's folder, its committed shards
    and, for a stage node, the stage (``export`` looks upstream for the tokenizer)."""

    root: str

    def stage_dir(self, node: str) -> str: ...

    def node_shards(self, node: str) -> list[tuple[str, str]]:
        """(key, path) of the node's committed shards (unions resolved)."""
        ...

    def node_stage(self, node: str) -> Any:
        """The node's ``Stage`` (None for an input)."""
        ...

    def node_hash(self, node: str) -> str: ...


class StageContext(Protocol):
    """A global stage's view of its run: its upstream shards, resumable phases of bounded
    tasks, its outputs, a work folder and its reports."""

    name: str  # the stage's name in the DAG (its output folder)
    params_hash: str
    workers: int
    #: (shard key, absolute parquet path) of every upstream shard, sorted by key
    upstream: list[tuple[str, str]]
    #: name -> {jobs, ran, seconds, max_task_seconds, peak_worker_rss_mb}, in the order run
    phases: dict[str, dict]

    @property
    def work_dir(self) -> str:
        """Intermediate files, one folder per params hash (a local path or a URL: build names
        with ``location.join``)."""
        ...

    @property
    def stage_dir(self) -> str:
        """The stage's own output folder (local path or URL)."""
        ...

    @property
    def source(self) -> RunSource:
        """The run the stage's input comes from."""
        ...

    def output(self, key: str) -> ShardSink: ...

    def done_keys(self) -> set[str]: ...

    def committed(self) -> dict[str, dict]:
        """Manifest entries of this stage's shards committed with its params hash, by key."""
        ...

    def entries(self) -> dict[str, dict]:
        """Every manifest entry of the stage's folder, whatever params made it, by key."""
        ...

    def commit(self, entries: list[dict]) -> None: ...

    def finished(self, keys: Sequence[str], report: str) -> bool:
        """Whether an earlier run committed every one of ``keys`` and wrote ``report``: the
        stage has nothing left to do."""
        ...

    def check_work_header(self, header: dict, create: bool = True) -> None: ...

    def phase(self, name: str, fn: Callable[[Any], Any], jobs: Sequence[Any], commit: bool = False,
              resources: Any = None, fold: Callable[[Any, Any], Any] | None = None,
              init: Any = None) -> Any: ...

    def recorded(self, name: str) -> list[Any]:
        """The results a (non-commit) phase recorded, in job order (this run's and earlier runs')."""
        ...

    def map(self, fn: Callable[..., Any], items: Sequence[tuple], phase: str) -> list[Any]: ...

    def read_report(self, filename: str) -> dict | None: ...

    def write_report(self, filename: str, report: dict, timings: bool = False) -> None: ...
