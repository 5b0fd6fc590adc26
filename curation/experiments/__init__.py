"""Experiments built on the pipeline (data ablations)."""
