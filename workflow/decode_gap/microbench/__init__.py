"""Micro-benchmarks at the configured model's per-GPU shapes: memory ceilings, all-reduce, decode GEMMs
(bf16 / fp8 / nvfp4), MoE, attention decode and launch overhead. Each stage chooses its backend by the
device's capability at run time and records which one ran; what the host cannot run is recorded as skipped.

`stages.run_stage(name, config, outputs)` is what the Snakemake scripts call.
"""
