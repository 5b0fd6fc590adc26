"""Dedup algorithms: Bloom filter, MinHash/LSH, connected components. No Ray, no run directory."""
