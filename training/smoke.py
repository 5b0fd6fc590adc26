"""``python -m training.smoke``: the trainer's start-up check, for images and fresh installs.

Imports the whole training stack (``training.train``: parallelism, checkpointing, attention,
data), checks the installed torch against the floor ``pyproject.toml`` declares, trains two
CPU steps of a tiny model on a synthetic pack (so a missing or moved torch API fails here, at
build time, not in the first job), and prints which attention kernels this machine can run --
probed by signature, not only by import. Exit code 0 = ready.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

#: The oldest torch whose APIs the trainer uses (keep in step with pyproject.toml):
#: FSDP2's public ``torch.distributed.fsdp.fully_shard`` / ``MixedPrecisionPolicy`` (2.6),
#: ``BlockMask.from_kv_blocks(..., seq_lengths=)`` (2.6), SDPA ``enable_gqa`` (2.5),
#: ``F.rms_norm`` (2.4), DCP ``get_state_dict``/``async_save`` and selective checkpointing
#: contexts (2.4). ``torch.nn.attention.varlen`` (newer) is optional: probed, never required.
TORCH_FLOOR = (2, 6)


def torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def main() -> int:
    import torch

    from training.attention import BACKENDS, unavailable
    from training.config import parse_config
    from training.synthetic import write_packed
    from training.train import run

    if torch_version() < TORCH_FLOOR:
        print(f"torch {torch.__version__} is older than the trainer's floor {'.'.join(map(str, TORCH_FLOOR))}", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
          + (f" ({torch.cuda.device_count()} x {torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
    devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if torch.cuda.is_available() else [])
    for dev in devices:
        kernels = {b: unavailable(b, dev) for b in BACKENDS if b != "auto"}
        print(f"attention on {dev.type}: " + "; ".join(f"{b}: {'ok' if r is None else r}" for b, r in kernels.items()))
    with tempfile.TemporaryDirectory() as tmp:
        data = write_packed(Path(tmp) / "pack", {"web": 16, "math": 8}, 32, vocab=128)
        cfg = parse_config({
            "run_dir": str(Path(tmp) / "run"),
            "model": {"vocab_size": 128, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2},
            "data": {"path": str(data), "seq_len": 32},
            "train": {"global_batch": 4, "micro_batch": 2, "steps": 2, "device": "cpu", "threads": 1},
            "checkpoint": {"every": 2},
            "metrics": {"every": 1, "progress": "off", "tensorboard": False},
        }, "smoke")
        code = run(cfg)
        losses = [r["loss"] for r in map(json.loads, (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines())
                  if r["kind"] == "train"]
        saved = (Path(tmp) / "run" / "checkpoints" / "latest").exists()
    ok = code == 0 and len(losses) == 2 and all(math.isfinite(x) for x in losses) and saved
    print(f"two CPU training steps: {'ok' if ok else 'FAILED'} (losses {[round(x, 4) for x in losses]}, checkpoint saved: {saved})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
