"""Stages: one module per stage type, named for it. Importing this package registers them all."""

from curation.stages.base import GlobalStage, MapStage, Stage, StageResult, registry  # noqa: F401

# Import stage modules for their registration side effect.
from curation.stages import (badwords, c4_quality, calibrate_rules, decontaminate, exact_dedup,  # noqa: F401,E402
                             export, extract, fineweb_quality, gopher_quality, gopher_repetition, langid,
                             minhash_dedup, mix, normalize, pack, pii, quality, quality_top, reextract, select,
                             tokenize, union, url_filter)
from curation.stages.union import UnionStage  # noqa: F401,E402
