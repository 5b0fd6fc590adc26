"""Readers (warc, wet, jsonl, parquet), input planning and the shard writer."""
