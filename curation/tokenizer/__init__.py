"""Tokenizers: training (BPE, Unigram) on a list of files, loading, encoding, and the report."""
