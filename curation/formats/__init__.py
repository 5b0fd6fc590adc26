"""On-disk schemas shared by curation and training. Imports nothing from curation."""
