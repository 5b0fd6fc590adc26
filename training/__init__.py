"""refinery training: a small, readable pretraining loop that eats the curation `pack` output.

Modules, in reading order:

- ``config``     pydantic models for the YAML config (errors name the file and the field)
- ``model``      decoder-only transformer (RoPE, RMSNorm, SwiGLU, GQA); no parallelism inside
- ``attention``  document-masked attention backends (flash-attn / torch varlen / FlexAttention on
                 CUDA, per-document SDPA segments anywhere, dense-mask SDPA) and ``auto``'s choice
- ``schedule``   LR (cosine / WSD / per-phase segments), sequence-length warm-up, mixture arithmetic
- ``data``       packed shards -> per-step batches (``shards``, ``order``, ``batches``, ``eval``);
                 the row order is arithmetic, so resume is arithmetic
- ``parallel``   process groups, the device mesh (pp x dp_replicate x dp_shard x tp), activation
                 checkpointing, compile, FSDP2 (meta-device init shard by shard), DDP, gradient
                 sync and clipping helpers
- ``tensor_parallel`` the DTensor plan that splits each block's attention heads and MLP over tp ranks (and, with
  sequence parallelism, the residual stream and norms over the sequence)
- ``pipeline_parallel`` blocks cut into stages, run by torch.distributed.pipelining's schedules
- ``guard``      skipping non-finite / spiking steps, stopping a run that keeps skipping
- ``counters``   per-interval and whole-run token counters
- ``checkpoint`` atomic, world-size independent checkpoints (torch.distributed.checkpoint) of
                 model, optimizer and the training-state components handed to it
- ``resume``     where a run starts (fresh, resume, anneal branch) and which plan applies
- ``metrics``    JSONL (+ TensorBoard if installed), console progress, MFU (peak FLOP/s table)
- ``profiling``  a window of steps under torch.profiler (``profile:``): trace and ops table per rank
- ``train``      the loop, plus ``main()`` for the CLI and ``python -m training``
- ``synthetic``  packed shards of learnable synthetic documents (tests, benchmark, drills)
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
