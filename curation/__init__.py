"""refinery curation: raw crawl dumps in, Parquet shards out."""

__version__ = "0.1.0"
