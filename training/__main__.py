"""``python -m training CONFIG [options]`` (also under ``torchrun --nproc-per-node N -m training``)."""

from __future__ import annotations

import argparse
import gc
import sys

from training.train import main


def cli(argv: list[str] | None = None) -> int:
    """Parse arguments and call ``training.train.main``."""
    p = argparse.ArgumentParser(prog="python -m training", description="Train a model on packed shards.")
    p.add_argument("config", help="training YAML, e.g. pipelines/train-tiny.yaml")
    p.add_argument("--resume", default=None, help="'auto' (default: RUN_DIR's latest checkpoint if any), 'never', or a checkpoint path")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. --set optim.lr=1e-3 (repeatable)")
    p.add_argument("--anneal-from", default=None, metavar="CKPT", help="branch an annealing phase from this stable-phase checkpoint")
    p.add_argument("--mix", default=None, help="annealing mix, e.g. web=0.3,math=0.7")
    p.add_argument("--peak-flops", type=float, default=None, metavar="FLOPS",
                   help="peak FLOP/s of one device for MFU, e.g. 989e12 (default: table by GPU name; none on CPU)")
    a = p.parse_args(argv)
    overrides = a.overrides + ([f"metrics.peak_flops={a.peak_flops}"] if a.peak_flops is not None else [])
    return main(a.config, a.resume, overrides, a.anneal_from, a.mix)


if __name__ == "__main__":
    code = cli()
    # The run is over and its files are closed: the interpreter's last collections would walk
    # every object it left (torch, the model, compile caches: seconds on a busy machine, each
    # process, each torchrun rank) to find garbage that exiting frees anyway. Frozen, they are
    # skipped; atexit handlers and module teardown run as usual.
    gc.freeze()
    sys.exit(code)
