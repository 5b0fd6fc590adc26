"""Stages: one module per stage family. Importing this package registers them all."""

from curation.stages.base import GlobalStage, MapStage, Stage, StageResult, UnionStage, registry  # noqa: F401

# Import stage modules for their registration side effect.
from curation.stages import (badwords, calibrate, decontaminate, dedup_exact, dedup_minhash, export, extract,  # noqa: F401,E402
                             filters, langid, mix, normalize, pack, pii, quality, reextract, select, tokenize,
                             url_filter)
