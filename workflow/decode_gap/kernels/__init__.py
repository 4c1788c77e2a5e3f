"""Decode kernels shared by the stages (core layer): the NVFP4 format and its weight-only GEMV, FP8 and
grouped-expert GEMVs, and the fused MoE routing. The micro-benchmarks time them; the kernel-level simulation runs
them in its step."""
