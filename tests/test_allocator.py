"""The worker's allocator setting (``curation.pipeline.allocator``): freed batch-sized arrays
are served again without page faults, counted by the kernel (``getrusage``), in a fresh
process each (the setting is per process and cannot be undone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = """
import json, resource, sys
import numpy as np
from curation.pipeline.allocator import keep_batch_blocks
took = keep_batch_blocks() if sys.argv[1] == "set" else None
for _ in range(3):  # warm: the heap grows once
    a = np.ones(4 << 20)  # 32 MB, touched, freed: a batch's array
    del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    a = np.ones(4 << 20)
    del a
print(json.dumps({"took": took, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, probe: str = _PROBE, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="keep_batch_blocks sets glibc's mallopt, which only Linux has: runs on any Linux machine")
def test_freed_batch_arrays_come_back_without_page_faults():
    plain, kept = _faults("plain"), _faults("set")
    assert kept["took"] is True
    # 20 x 32 MB touched: from fresh mmap every time, at least a fault per 2 MB (huge
    # pages; 8,192 with 4 KB ones); once the heap keeps the block, almost none
    assert plain["faults"] >= 20 * 16
    assert kept["faults"] * 10 < plain["faults"]
    # the operator's switch leaves the allocator as it is
    off = _faults("set", REFINERY_MALLOC_TUNING="0")
    assert off["took"] is False and off["faults"] >= 20 * 16


_ARROW_PROBE = """
import json, resource, sys, time
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from curation.pipeline.allocator import keep_batch_blocks
took = keep_batch_blocks() if sys.argv[1] == "set" else None
xs = [pa.array(np.ones(n)) for n in (1 << 17, 1 << 18, 1 << 19, 1 << 20)]
faults = []
for _ in range(10):  # a batch's columns of a few sizes (~60 MB), written and freed, batches apart
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ys = [pc.add(x, k) for k in range(4) for x in xs]
    del ys
    time.sleep(0.25)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"took": took, "pool": pa.default_memory_pool().backend_name, "faults": faults}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="keep_batch_blocks sets glibc's mallopt, which only Linux has: runs on any Linux machine")
def test_arrow_buffers_come_from_the_kept_heap():
    kept = _faults("set", _ARROW_PROBE)
    assert kept["took"] is True and kept["pool"] == "system"
    # the first batch faults its ~15,000 pages in; once the heap has grown to a batch's size
    # (fragments of it can grow it a few MB more), later batches reuse them
    assert kept["faults"][0] > 10_000
    assert sum(kept["faults"][5:]) < kept["faults"][0] // 4, kept["faults"]
    off = _faults("set", _ARROW_PROBE, REFINERY_MALLOC_TUNING="0")
    assert off["took"] is False and off["pool"] != "system"
