"""Model-based quality: teachers that score texts, labels from their top and bottom fractions,
a fastText classifier trained on those labels (with a card), and its evaluation.

- ``teachers``: ``Teacher.score(texts) -> np.ndarray`` (reference corpus, perplexity, callable)
- ``labels``:   corpora readers and top/bottom-fraction labelling into fastText training files
- ``classifier``: fastText model loading (shared with language ID), training, card, evaluation
"""
