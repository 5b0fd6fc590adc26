"""The pipeline layer: DAG, plan, executor, run directory, progress and stats. Imports stages and algorithms, never the other way."""
