"""Why torch sees no CUDA device on a machine that has an NVIDIA driver.

PyPI's torch wheels are CUDA 13 builds from 2.9 on, and CUDA 13 needs driver >= 580: on a
cluster still at R535-R570, ``torch.cuda.is_available()`` is simply False. ``device: cuda`` then
stops with the reason (driver found, which it is, what this build needs, which wheel to install),
and ``device: auto`` warns loudly instead of quietly training on the CPU of a GPU node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

#: The oldest Linux driver branch each CUDA major version runs on (minor-version compatibility:
#: any 12.x build runs on >= 525.60.13, 13.x on >= 580).
DRIVER_FLOOR = {11: 450, 12: 525, 13: 580}
CU12_WHEEL = "pip install torch --index-url https://download.pytorch.org/whl/cu126"


def driver_version() -> str | None:
    """The loaded NVIDIA kernel driver's version ("550.54.15"), or None when there is none."""
    proc = Path("/proc/driver/nvidia/version")
    if proc.exists():
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", proc.read_text(errors="replace"))
        if m:
            return m.group(1)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
        except (OSError, subprocess.SubprocessError):
            return None
        return out[0] if out else None
    return None


def unavailable_reason(driver: str | None, cuda: str | None, torch_version: str) -> str | None:
    """Why this torch build (``torch.version.cuda`` = ``cuda``) cannot use a GPU driven by
    ``driver``; None when no NVIDIA driver is present (a CPU machine: nothing to explain)."""
    if driver is None:
        return None
    if cuda is None:
        return (f"NVIDIA driver {driver} is present but torch {torch_version} is a CPU-only build; "
                f"install a CUDA wheel ({CU12_WHEEL}, or the default PyPI wheel with driver >= {DRIVER_FLOOR[13]})")
    major = int(cuda.split(".")[0])
    floor = DRIVER_FLOOR.get(major)
    have = int(driver.split(".")[0])
    if floor is not None and have < floor:
        return (f"NVIDIA driver {driver} < required {floor} for this torch build (torch {torch_version}, CUDA {cuda}); "
                f"install the CUDA 12 wheel ({CU12_WHEEL}) or update the driver to >= {floor}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"NVIDIA driver {driver} is new enough for CUDA {cuda}, yet torch sees no device"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
            + "; check `nvidia-smi` and the container's GPU access")
