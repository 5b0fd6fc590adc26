"""Exact deduplication of documents or paragraphs across the whole upstream.

```yaml
exact: {type: exact_dedup, input: c4, level: document, against: [runs/cc-2024-10/exact]}
```

A key is two 64-bit hashes of the normalised text (NFKC, casefold, whitespace runs collapsed):
of the whole document (``level: document``) or of each non-blank line (``level: paragraph``;
lines are paragraphs in extracted web text, as in cc_net). See ``curation.dedup.exact``.
Markdown (``extract: {format: markdown}``, said by the text field's metadata) is keyed by its
plain view (``curation.text.markup``): two copies of a page that differ only in markup
are duplicates, as their text extractions are. The view is line for line, so a paragraph key
names the Markdown line that is removed; the stored text is unchanged.

Phases (``StageContext.phase``: resumable, timed; results never depend on the worker count):

1. keys (one task per block of upstream shards, ``curation.io.shards.blocks``): hash every
   document or paragraph; write the keys with their partition (a hash prefix) to
   ``_work/<params>/keys/<block>.parquet``.
2. partitions (one task per partition): read the partition's keys from every shard and decide
   duplicates exactly (sorted keys; the copy with the lowest ``id`` survives, or the one
   the ``keep`` policy ranks best: ``curation.dedup.keeper``). Keys an earlier
   dump's filter holds (``against``) are duplicates too. The partition's Bloom filter is built
   for its actual count of distinct keys (``bloom.expected_items`` split over the partitions
   is only the floor) and saved to ``RUN/STAGE/_bloom/part-NNNNN.bloom`` for a later
   dump's ``against``.
3. apply (one task per block, reading its range of each partition's duplicates once): drop duplicate documents (``exact_dedup:duplicate``)
   or remove duplicate paragraphs, dropping documents left without text
   (``exact_dedup:empty_after_paragraph_dedup``). One output shard per upstream shard key,
   except that a block's consecutive small shards share one (``curation.io.shards.output_groups``).

An ``against`` filter that has been filled beyond its capacity answers "seen" for unseen keys:
the stage measures each one's false-positive rate and refuses to run (naming the filter and
its fill) when it exceeds the configured rate by more than 2×, instead of dropping data.
``RUN/STAGE/_bloom_report.json`` holds, per partition, keys, duplicates (in the run and from
``against``), filter size and fill, predicted and measured false-positive rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from curation.io import files, location
from curation.dedup.bloom import BloomFilter
from curation.dedup.exact import PARAGRAPH_SEPARATOR, drop_paragraphs, duplicate_keys, filter_health, key_partition, text_keys
from curation.dedup import keeper as keepers
from curation.dedup.index import CorpusIndex, ExactPart, exact_matches, is_index
from curation.dedup.minhash import NORMALIZATION, read_artifact, write_artifact
from curation.io.artifacts import read_partition, write_partitioned
from curation.io.shards import block_name, blocks, replace_column, split_kept_rejected
from curation.stages.base import GlobalStage, Resources, registry
from curation.stages.paths import PathStr
from curation.stages.context import GroupedOutputs, StageContext, block_outputs, output_keys
from curation.text.markup import markup_of, plain_texts


#: Bump when keys or the choice of duplicates change for the same parameters.
#: 3: key files indexed by partition; 4: one key file per block of shards; 5: Markdown (the text
#: field's mark) keyed by its plain view
EXACT_VERSION = 5
REPORT = "_bloom_report.json"
#: the run's Bloom filters, one per partition: kept with the stage's output (not in ``_work``)
#: for a later run's ``against``
BLOOM_DIR = "_bloom"
#: the run's surviving keys (hash, hash2, id), one sorted file per partition: what
#: ``refinery index build`` copies into a corpus index
KEYS_DIR = "_keys"
REASON_DUPLICATE = "exact_dedup:duplicate"
#: a key a corpus index holds: ``exact_dedup:in_index=MEMBER:ID`` (the snapshot and the id kept there)
REASON_IN_INDEX = "exact_dedup:in_index="
REASON_EMPTY = "exact_dedup:empty_after_paragraph_dedup"
_HASH_BATCH = 2048  # documents normalised at once: peak memory is ~15 bytes per text byte of a batch
#: an ``against`` filter is refused when its false-positive rate exceeds the configured one by this
AGAINST_TOLERANCE = 2.0


class AgainstFilterOverfilled(ValueError):
    """An ``against`` filter holds more keys than it was sized for: querying it would drop
    unique documents."""


class BloomConfig(BaseModel):
    """Bloom filter sizing: ``expected_items`` for the whole corpus (split evenly over the
    partitions) is a floor; a partition with more distinct keys gets a filter sized for them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # at most 10**12 keys (~3.6 TB of filters at 1e-6): past that a value is a typo, not a corpus
    expected_items: int = Field(default=10_000_000, ge=1, le=10**12)
    false_positive_rate: float = Field(default=1e-6, gt=0, lt=1)


# ---------------------------------------------------------------------------------------------
# jobs and tasks (run in Ray workers)


@dataclass(frozen=True)
class KeysJob:
    paths: tuple[str, ...]  # a block of upstream shards
    first: int  # the block's first shard's number
    out: str
    level: str
    partitions: int
    seed: int
    header: dict
    keep: str = "first"
    rank_column: str | None = None  # the input column the keeper policy reads


_EMPTY_KEYS = {"part": pa.int32(), "id": pa.string(), "shard": pa.int32(), "row": pa.int32(), "para": pa.int32(),
               "hash": pa.uint64(), "hash2": pa.uint64()}


def keys_task(job: KeysJob) -> dict:
    """Phase 1 for one block of upstream shards: their keys, sorted by partition, in one file."""
    parts, rows_in = [], 0
    attr = keepers.attribute_column(job.keep)
    for k, path in enumerate(job.paths):
        table = location.read_parquet(path, columns=["id", "text"] + ([job.rank_column] if attr else []))
        rows_in += table.num_rows
        values = keepers.attribute(table.column(job.rank_column), job.keep) if attr else None
        markup = markup_of(table.schema.field("text"))
        for lo in range(0, table.num_rows, _HASH_BATCH):
            batch = table.slice(lo, _HASH_BATCH)
            # Markdown is keyed by its plain view (line for line: paragraph numbers are its lines')
            texts = plain_texts(batch.column("text").combine_chunks(), markup)
            rows, para, h, h2 = text_keys(texts, job.level, job.seed)
            rows = rows + lo
            cols = {"part": pa.array(key_partition(h, job.partitions), pa.int32()),
                    "id": table.column("id").take(pa.array(rows)),
                    "shard": pa.array(np.full(len(rows), job.first + k, np.int32)), "row": pa.array(rows),
                    "para": pa.array(para), "hash": pa.array(h), "hash2": pa.array(h2)}
            if attr:
                cols[attr] = values.take(pa.array(rows))
            parts.append(pa.table(cols))
    empty = dict(_EMPTY_KEYS, **({attr: keepers.attribute_type(job.keep)} if attr else {}))
    keys = pa.concat_tables(parts) if parts else pa.table({k: pa.array([], t) for k, t in empty.items()})
    keys = keys.take(pc.sort_indices(keys, [("part", "ascending"), ("shard", "ascending"), ("row", "ascending"),
                                            ("para", "ascending")]))
    write_partitioned(keys.drop_columns(["part"]), keys.column("part").to_numpy(), job.out, job.header)
    return {"shard": job.first, "keys": keys.num_rows, "rows": rows_in}


@dataclass(frozen=True)
class PartitionJob:
    p: int
    key_files: tuple[str, ...]
    dups_out: str
    bloom_out: str
    against: tuple[str, ...]
    capacity_floor: int
    false_positive_rate: float
    seed: int
    bloom_params: dict
    header: dict
    keys_out: str | None = None
    index: tuple[ExactPart, ...] = ()
    keep: str = "first"
    source_rank: tuple[str, ...] = ()
    superseded_out: str | None = None  # indexed copies a new document replaced (keep: latest, ...)
    stage: str = ""


def _against_seen(job: PartitionJob, h: np.ndarray) -> tuple[np.ndarray, list[dict]]:
    """Which keys an earlier dump's filter holds; refuses a filter whose false-positive rate is
    over ``AGAINST_TOLERANCE`` × the configured one (it would drop unique documents)."""
    seen = np.zeros(len(h), dtype=bool)
    health = []
    for path in job.against:
        bf = BloomFilter.load(path)
        info = {"filter": path, **filter_health(bf, seed=job.seed + job.p)}
        rate = max(info["false_positive_rate_from_fill"], info["measured_false_positive_rate"])
        if rate > AGAINST_TOLERANCE * job.false_positive_rate:
            raise AgainstFilterOverfilled(
                f"exact_dedup.against: {path} is overfilled: {info['fill_ratio']:.1%} of its bits are set, so it "
                f"answers 'seen' for {rate:.2e} of keys it never saw (configured {job.false_positive_rate:.0e}); "
                "querying it would drop unique documents. Rebuild that run's filters (rerun its exact_dedup "
                "stage with this version, which sizes them from the actual key counts) or leave it out.")
        seen |= bf.contains(h)
        health.append(info)
    return seen, health


def partition_task(job: PartitionJob) -> dict:
    """Phase 2 for one partition: its duplicate keys, decided exactly, and its Bloom filter."""
    attr = keepers.attribute_column(job.keep)
    cols = ["id", "shard", "row", "para", "hash", "hash2"] + ([attr] if attr else [])
    tables = [read_partition(f, job.p, job.header, columns=cols) for f in job.key_files]
    empty = dict(_EMPTY_KEYS, **({attr: keepers.attribute_type(job.keep)} if attr else {}))
    keys = pa.concat_tables(tables) if tables else pa.table({k: pa.array([], empty[k]) for k in cols})
    rank = keepers.rank(keys.column(attr), job.keep, job.source_rank) if attr else None
    in_run = duplicate_keys(keys, rank)
    h = keys.column("hash").to_numpy()
    from_against, health = _against_seen(job, h)
    from_index, match = np.zeros(len(h), dtype=bool), [None] * len(h)
    lookup: dict = {}
    superseded = 0
    if job.index:
        from_index, match = exact_matches(job.index, h, keys.column("hash2").to_numpy(), attr,
                                          latest_member_first=job.keep != "first")
        lookup = dict(exact_matches.last)
        if attr:  # the run's copy of a key (its best) against the indexed copy: the policy decides
            held = np.flatnonzero(from_index & ~in_run)
            theirs = keepers.rank(pa.array([exact_matches.values[i] for i in held], keepers.attribute_type(job.keep)),
                                  job.keep, job.source_rank)
            wins = held[keepers.new_wins(job.keep, rank[held], theirs)]
            ids = keys.column("id").take(pa.array(wins, pa.int64())).to_pylist()
            table = keepers.superseded_table([match[i] for i in wins.tolist()], ids, job.stage)
            table = table.take(pc.sort_indices(table, [("member", "ascending"), ("id", "ascending"), ("by", "ascending")]))
            files.write_parquet(table, job.superseded_out)
            superseded = len(wins)
            if len(wins):
                from_index[wins] = False
                for i in wins.tolist():
                    match[i] = None
    dup = in_run | from_against | from_index
    if job.keys_out is not None:  # the survivors' keys, sorted: a corpus index's exact side
        survivors = keys.select(["hash", "hash2", "id"] + ([attr] if attr else [])).filter(pa.array(~dup))
        survivors = survivors.take(pc.sort_indices(survivors, [("hash", "ascending"), ("hash2", "ascending")]))
        files.write_parquet(survivors, job.keys_out, row_group_size=65536)
    distinct = h[~in_run]
    bloom = BloomFilter.for_capacity(max(len(distinct), job.capacity_floor), job.false_positive_rate, job.seed,
                                     job.bloom_params)
    bloom.add(distinct)
    bloom.save(job.bloom_out)
    dups = keys.select(["shard", "row", "para"]).append_column("match", pa.array(match, pa.string()))
    dups = dups.filter(pa.array(dup))
    dups = dups.take(pc.sort_indices(dups, [("shard", "ascending"), ("row", "ascending"), ("para", "ascending")]))
    write_artifact(dups, job.dups_out, job.header, row_group_size=16384)
    # the run's own filter, for the report: 65,536 probes (an earlier dump's filter, which
    # can refuse a run, gets the default 262,144); the probes are a fixed cost per partition
    own = filter_health(bloom, samples=1 << 16, seed=job.seed + job.p)
    return {"partition": job.p, "keys": keys.num_rows, "distinct_keys": int(len(distinct)),
            "duplicates": int(dup.sum()), "in_run_duplicates": int(in_run.sum()),
            "against_duplicates": int((from_against & ~in_run).sum()),
            "index_duplicates": int(from_index.sum()), "index_lookup": lookup, "superseded": superseded,
            "capacity": max(len(distinct), job.capacity_floor), "m": bloom.m, "k": bloom.k,
            "fill_ratio": own["fill_ratio"], "predicted_false_positive_rate": bloom.predicted_false_positive_rate(),
            "measured_false_positive_rate": own["measured_false_positive_rate"], "loaded_filters": len(job.against),
            "against_filters": health}


@dataclass(frozen=True)
class ApplyJob:
    outs: GroupedOutputs  # the block's outputs (small shards share one)
    paths: tuple[str, ...]
    first: int  # the block's first shard's number
    dup_files: tuple[str, ...]
    level: str
    header: dict


def apply_block(job: ApplyJob) -> list[dict]:
    """Phase 3 for one block: each partition's duplicates of the block's shards read once
    (one range of each file, sorted by shard), then each shard deduplicated."""
    last = job.first + len(job.paths) - 1
    parts = [read_artifact(f, job.header, filters=[("shard", ">=", job.first), ("shard", "<=", last)])
             for f in job.dup_files]
    dups = pa.concat_tables(parts) if parts else None
    shard = dups.column("shard").to_numpy() if dups is not None else np.zeros(0, np.int32)
    w = job.outs.writer()
    stage = job.outs.stage
    for k, path in enumerate(job.paths):
        mine = dups.filter(pa.array(shard == job.first + k)) if dups is not None else None
        w.add(*apply_task(stage, path, mine, job.level))
    return w.done()


def apply_task(stage: str, path: str, dups: pa.Table | None, level: str) -> tuple[pa.Table, pa.Table | None, int]:
    """One upstream shard, given its duplicate (row, para) rows: its kept and rejected rows."""
    table = location.read_parquet(path)
    rows = dups.column("row").to_numpy() if dups is not None else np.zeros(0, np.int32)
    reasons = np.full(table.num_rows, None, dtype=object)
    if level == "document":
        reasons[rows] = REASON_DUPLICATE
        if dups is not None and "match" in dups.column_names:
            m = dups.column("match")
            at = np.flatnonzero(pc.is_valid(m).to_numpy(zero_copy_only=False))
            if len(at):
                reasons[rows[at]] = [REASON_IN_INDEX + x for x in m.take(pa.array(at)).to_pylist()]
    else:
        paras = dups.column("para").to_numpy() if dups is not None else np.zeros(0, np.int32)
        removed = np.zeros(table.num_rows, dtype=np.int32)
        if len(rows):
            order = np.lexsort((paras, rows))
            rows, paras = rows[order], paras[order]
            np.add.at(removed, rows, 1)
            texts = table.column("text").to_pylist()
            bounds = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1], True])
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                r = int(rows[lo])
                texts[r] = drop_paragraphs(texts[r] or "", paras[lo:hi].tolist())
            table = replace_column(table, "text", pa.array(texts, table.schema.field("text").type))
            # left without text: judged on what was keyed (Markdown left with a fence or a
            # table's separator row only has no text)
            changed = rows[bounds[:-1]]
            left = plain_texts(table.column("text").take(pa.array(changed)), markup_of(table.schema.field("text")))
            for r, t in zip(changed.tolist(), left.to_pylist()):
                if not t.strip():
                    reasons[r] = REASON_EMPTY
        table = table.append_column("dup_paragraphs", pa.array(removed, pa.int32()))
    kept, rejected = split_kept_rejected(table, pa.array(reasons.tolist(), pa.string()), stage)
    return kept, rejected, table.num_rows


# ---------------------------------------------------------------------------------------------
# the stage


@registry.register("exact_dedup")
class ExactDedup(GlobalStage):
    """Remove exact duplicate documents (``level: document``) or paragraphs (``level:
    paragraph``) across the whole upstream, keeping the copy with the lowest ``id``.

    ``bloom`` sets the filters' false-positive rate and their minimum size (``expected_items``
    over the whole corpus); ``against`` lists earlier runs' filters (a stage directory holding
    ``_bloom_report.json``, or its ``bloom`` folder) to drop what an earlier dump already had.
    Their key parameters (level, partitions, normalisation, seed) must be identical.
    """

    type: Literal["exact_dedup"] = "exact_dedup"
    columns: ClassVar[tuple[str, ...]] = ('dup_paragraphs',)
    #: a partition task holds its keys (~40 B each) and its filter
    resources: ClassVar[Resources] = Resources(cpus=1, memory_mb=1024)
    level: Literal["document", "paragraph"] = "document"
    bloom: BloomConfig = BloomConfig()
    partitions: int = Field(default=16, ge=1, le=4096)
    seed: int = Field(default=0, ge=0)
    against: list[PathStr] = Field(default_factory=list)
    #: which copy survives (``curation.dedup.keeper``): first (lowest id), latest (``date_column``),
    #: highest_quality (``quality``) or source_rank (``source`` by ``source_rank``); against a
    #: corpus index, a new copy the policy prefers is kept and the indexed one is listed in
    #: ``RUN/STAGE/_superseded/``
    keep: keepers.Keep = "first"
    source_rank: list[str] = Field(default_factory=list)
    date_column: str = "date"

    @model_validator(mode="after")
    def _check_keep(self) -> ExactDedup:
        if self.keep == "source_rank" and not self.source_rank:
            raise ValueError("keep: source_rank needs source_rank: [a source, ...] (best first)")
        if self.keep != "first" and self.level != "document":
            raise ValueError(f"keep: {self.keep} ranks documents: it needs level: document")
        return self

    def params(self) -> dict[str, Any]:
        p = super().params()
        for k, default in (("keep", "first"), ("source_rank", []), ("date_column", "date")):
            if p.get(k) == default:
                p.pop(k, None)  # runs made before keeper policies keep their params hash
        return p

    def keeper(self) -> dict[str, Any]:
        """The keeper policy's parameters (empty for ``first``)."""
        if self.keep == "first":
            return {}
        return {"keep": self.keep, **({"source_rank": list(self.source_rank)} if self.keep == "source_rank" else {}),
                **({"date_column": self.date_column} if self.keep == "latest" else {})}

    def header(self) -> dict[str, Any]:
        """What every artifact of this stage depends on."""
        return {"algorithm": "exact-dedup-xxh3x2-sorted", "version": EXACT_VERSION, "seed": self.seed,
                "params": {"level": self.level, "partitions": self.partitions, "normalization": NORMALIZATION,
                           "paragraph_separator": PARAGRAPH_SEPARATOR, "bloom": self.bloom.model_dump(),
                           **self.keeper()}}

    def bloom_params(self) -> dict[str, Any]:
        """What a filter's keys mean: filters are queried across runs only when these agree."""
        return {"level": self.level, "partitions": self.partitions, "normalization": NORMALIZATION,
                "hash": "xxh3_64", "key_seed": self.seed}

    def partition_capacity(self) -> int:
        return max(1, -(-self.bloom.expected_items // self.partitions))

    def against_files(self, p: int) -> list[str]:
        """Persisted filters of partition ``p`` from the runs listed in ``against``, their key
        parameters checked here, on the driver: one clear error before any task starts."""
        out = []
        for entry in self.against:
            if is_index(entry):
                continue
            d = str(entry).rstrip("/")
            if location.exists(location.join(d, REPORT)):
                d = json.loads(location.read_text(location.join(d, REPORT)))["bloom_dir"]
            f = location.join(d, f"part-{p:05d}.bloom")
            if not location.exists(f):
                raise FileNotFoundError(f"exact_dedup.against: {f} does not exist (is {entry} an exact_dedup "
                                        f"stage directory, or its bloom folder, with {self.partitions} partitions?)")
            found = BloomFilter.read_header(f)
            expected = {"algorithm": found.get("algorithm"), "version": found.get("version"), "seed": self.seed,
                        "params": {**self.bloom_params(), **{k: found.get("params", {}).get(k)
                                                            for k in ("expected_items", "false_positive_rate")}}}
            BloomFilter.check_header({k: found.get(k) for k in expected}, expected, f"exact_dedup.against: {f}")
            out.append(f)
        return out

    def index_params(self) -> dict[str, Any]:
        """What a corpus index's exact keys must have been made with for this stage to query them."""
        return {**self.bloom_params(), "algorithm": "exact-dedup-xxh3x2-sorted"}

    def indexes(self) -> list[CorpusIndex]:
        """The corpus indexes among ``against``, their key parameters checked (on the driver)."""
        out = []
        attr = keepers.attribute_column(self.keep)
        for entry in self.against:
            if is_index(entry):
                idx = CorpusIndex(str(entry))
                idx.check_exact(self.index_params(), f"exact_dedup.against: {entry}")
                idx.check_keep("exact", attr, self.keep, "their copies", f"exact_dedup.against: {entry}")
                out.append(idx)
        return out

    def _check_columns(self, ctx: StageContext, paths: list[str]) -> str | None:
        col = keepers.source_column(self.keep, self.date_column)
        if col is not None:
            missing = [p for p in paths if col not in location.read_schema(p).names]
            if missing:
                raise ValueError(f"{ctx.name}: keep: {self.keep} reads a {col!r} column, which {missing[0]} lacks")
        return col

    def run(self, ctx: StageContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        header = self.header()
        ctx.check_work_header(header, create=False)
        bloom_dir = location.join(ctx.stage_dir, BLOOM_DIR)
        sizes = location.sizes(paths)
        spans = blocks(sizes)
        outputs = block_outputs(ctx, keys, sizes, spans)
        if ctx.finished(output_keys(outputs), REPORT):
            return
        work = ctx.work_dir
        ctx.check_work_header(header)
        P = self.partitions
        key_files = tuple(location.join(work, "keys", f"{block_name(keys[lo:hi])}.parquet") for lo, hi in spans)
        dup_files = tuple(location.join(work, "dups", f"part-{p:05d}.parquet") for p in range(P))
        if set(output_keys(outputs)) - ctx.done_keys():
            against = [tuple(self.against_files(p)) for p in range(P)]  # fail before any work
            indexes = self.indexes()
            rank_column = self._check_columns(ctx, paths)
            keys_dir = location.join(ctx.stage_dir, KEYS_DIR)
            sup_dir = location.join(ctx.stage_dir, keepers.SUPERSEDED_DIR)
            superseding = bool(indexes) and self.keep != "first"
            ctx.phase("keys", keys_task, [KeysJob(tuple(paths[lo:hi]), lo, key_files[b], self.level, P, self.seed,
                                                  header, self.keep, rank_column) for b, (lo, hi) in enumerate(spans)])
            ctx.phase("partitions", partition_task, [
                PartitionJob(p, key_files, dup_files[p], location.join(bloom_dir, f"part-{p:05d}.bloom"), against[p],
                             self.partition_capacity(), self.bloom.false_positive_rate, self.seed, self.bloom_params(),
                             header, location.join(keys_dir, f"part-{p:05d}.parquet"),
                             tuple(x for idx in indexes for x in idx.exact_parts(p)), self.keep,
                             tuple(self.source_rank),
                             location.join(sup_dir, f"part-{p:05d}.parquet") if superseding else None, ctx.name)
                for p in range(P)])
            ctx.phase("apply", apply_block, [ApplyJob(outputs[b], tuple(paths[lo:hi]), lo, dup_files, self.level, header)
                                             for b, (lo, hi) in enumerate(spans)], commit=True)
        self._write_report(ctx, bloom_dir)

    def _write_report(self, ctx: StageContext, bloom_dir: str) -> None:
        parts = [r for r in ctx.recorded("partitions") if r is not None]
        m = sum(p["m"] for p in parts)
        ctx.write_report(REPORT, {
            "level": self.level, "partitions": self.partitions, "bloom_dir": bloom_dir,
            "configured_false_positive_rate": self.bloom.false_positive_rate,
            "expected_items": self.bloom.expected_items, "keys": sum(p["keys"] for p in parts),
            "duplicates": sum(p["duplicates"] for p in parts),
            "in_run_duplicates": sum(p["in_run_duplicates"] for p in parts),
            "against_duplicates": sum(p["against_duplicates"] for p in parts),
            "index_duplicates": sum(p.get("index_duplicates", 0) for p in parts),
            "superseded": sum(p.get("superseded", 0) for p in parts),
            "indexes": [{"index": i.root, "generation": i.manifest["generation"]} for i in self.indexes()],
            "fill_ratio": (sum(p["fill_ratio"] * p["m"] for p in parts) / m) if parts else 0.0,
            "predicted_false_positive_rate": max((p["predicted_false_positive_rate"] for p in parts), default=0.0),
            "measured_false_positive_rate": max((p["measured_false_positive_rate"] for p in parts), default=0.0),
            "per_partition": parts}, timings=True)
