"""Stages: one module per stage family. Importing this package registers them all."""

from curation.stages.base import GlobalStage, MapStage, Stage, StageResult, UnionStage, registry  # noqa: F401

# Import stage modules for their registration side effect.
from curation.stages import calibrate, decontaminate, dedup_exact, dedup_minhash, export, extract, filters, langid, mix, pack, quality, reextract, select, tokenize, toolbox  # noqa: F401,E402
