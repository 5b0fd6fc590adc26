"""``python -m curation.cli``: the `refinery` command, as the service starts each run."""

import atexit
import gc
import sys

from curation.cli import app

if __name__ == "__main__":  # pragma: no cover
    # Registered first, so it runs last of the exit handlers (after Ray's shutdown): the
    # interpreter's final collections would walk every object the command left (pyarrow, Ray,
    # the stages: about a second a process on a busy machine) to find garbage that exiting
    # frees anyway. Frozen, they are skipped; module teardown runs as usual.
    atexit.register(gc.freeze)
    sys.exit(app())
