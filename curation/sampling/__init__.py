"""Data-mix sampling: per-source token targets, a per-document choice that is a pure function
of (seed, source, document id), and an interleaving key computed per shard."""
