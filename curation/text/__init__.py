"""Text algorithms: word, line and paragraph splitting, signals, n-gram repetition. No Ray, no run directory."""
