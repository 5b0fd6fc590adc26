"""``refinery export RUN/STAGE --format F --out DIR``: the export stage (``curation/stages/export.py``)
run on its own over a finished run's node, writing into DIR instead of a stage folder.

DIR plays the part of the export stage's folder: the stage's manifest lines
(``DIR/_manifest.jsonl``, one per output shard, so a killed export resumes), ``DIR/export.json``
and ``DIR/_phases.json`` (timings, peak worker RSS) sit beside the files. The run directory is only
read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from curation.export import hand_off
from curation.export.common import ExportError
from curation.formats.manifest import MANIFEST
from curation.pipeline.context import GlobalContext, RunView
from curation.pipeline.executor import init_ray
from curation.pipeline.rundir import RunDir, stage_of
from curation.stages.export import EXPORT_MANIFEST, Export
from curation.stages.mix import REPORT as MIX_REPORT


def export_stage(stage_path: str | Path, fmt: str, out: str | Path, tokenizer: str | Path | None = None,
                 workers: int | None = None, address: str | None = None,
                 report: Callable[[str, int, int], None] | None = None, mds_size_limit: int | None = None) -> dict:
    """Export ``RUN/STAGE`` to ``out`` in ``fmt``; returns the manifest (``out/export.json``).
    Raises ``ExportError`` (one line) for what cannot be exported."""
    hit = stage_of(stage_path)
    if hit is None:
        raise ExportError(f"{stage_path}: not RUN/STAGE of a refinery run (a run directory holds dag.yaml)")
    source, node = hit
    params = {"type": "export", "input": node, "format": fmt,
              "tokenizer": str(tokenizer) if tokenizer else None}
    if mds_size_limit:
        params["mds_size_limit"] = mds_size_limit
    try:
        stage = Export(**params)
    except ValidationError as e:
        err = e.errors()[0]
        raise ExportError(f"--{err['loc'][0] if err['loc'] else 'format'}: {err['msg']}".replace("Value error, ", "")) from None
    out = Path(out).resolve()
    if not source.remote and (str(out) == source.root or Path(source.root) in out.parents):
        raise ExportError(f"{out}: inside the run directory; export elsewhere, or add an export stage to the DAG")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise ExportError(f"{out}: exists and holds something other than an export; use another --out")
    dag = source.load_dag()
    hashes = dag.hashes()
    upstream = source.shard_files(dag, node, hashes)
    view = RunView(source, dag)
    stage.check(view, node, upstream)  # refuse before Ray starts
    workers = init_ray(address, workers)
    ctx = GlobalContext(RunDir(out.parent), out.name, stage.params_hash([hashes[node]]), workers, upstream,
                        Export.resources, report=report or (lambda phase, done, total: None), source=view)
    manifest = stage.export(ctx, node)
    ctx.finish(keep_work=stage.keep_work)
    return manifest


def read_manifest(out: str | Path) -> dict:
    return json.loads((Path(out) / EXPORT_MANIFEST).read_text())


def parse_weights(spec: str) -> dict[str, float]:
    """Per-source weights from ``web=0.4,math=0.6``, a mix stage (``RUN/MIX``: its report's
    target shares) or a mix report file."""
    hit = stage_of(spec) if Path(spec).is_dir() else None
    if hit is not None:
        rep = hit[0].read_report(hit[1], MIX_REPORT)
        if rep is None:
            raise ExportError(f"{spec}: no {MIX_REPORT} (not a finished mix stage)")
        return {s: float(r["target_share"]) for s, r in rep["sources"].items()}
    if Path(spec).is_file():
        rep = json.loads(Path(spec).read_text())
        return {s: float(r["target_share"]) for s, r in rep["sources"].items()}
    try:
        pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()]
        return {k.strip(): float(v) for k, v in pairs}
    except ValueError:
        raise ExportError(f"--weights: {spec!r} is neither source=weight,... nor a mix stage or report") from None


def hand_off_line(out: str | Path, weights: dict[str, float] | None = None) -> str:
    out = Path(out).resolve()
    return hand_off(read_manifest(out), str(out), weights)
