"""refinery training: a small, readable pretraining loop that eats the curation `pack` output.

Modules, in reading order:

- ``config``     pydantic models for the YAML config (errors name the file and the field)
- ``model``      decoder-only transformer (RoPE, RMSNorm, SwiGLU, GQA); no parallelism inside
- ``attention``  document-masked attention: flash-attn varlen on CUDA, torch SDPA elsewhere
- ``schedule``   LR (cosine / WSD / per-phase segments), sequence-length warm-up, mixture arithmetic
- ``data``       streaming packed shards; the row order is arithmetic, so resume is arithmetic
- ``parallel``   process groups, DDP / FSDP2, activation checkpointing, gradient sync helpers
- ``checkpoint`` atomic, world-size independent checkpoints (torch.distributed.checkpoint)
- ``metrics``    JSONL (+ TensorBoard if installed), console progress, MFU
- ``train``      the loop, plus ``main()`` for the CLI and ``python -m training``
- ``synthetic``  packed shards of learnable synthetic documents (tests, benchmark, drills)
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
