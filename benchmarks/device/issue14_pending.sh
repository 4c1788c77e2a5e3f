#!/usr/bin/env bash
# The NVFP4 fused MoE's forms that no GPU has timed yet (issue 14; the 2026-12-04 and 12-05 stops): two device calls,
# each under the 600 s a call may take (a probe takes about 20-40 s: the experts built and quantised on the GPU, the
# kernels compiled, each form checked and timed; 120 s at most). Each line checks, then times, the default plan (`all
# experts`) beside the splits or forms named, GLM-5 shapes over the 256-expert table, CUDA graph after an L2 flush
# (benchmarks/device/moe_e_probe.py). Run from the repository root on the device:
#
#     bash benchmarks/device/issue14_pending.sh plans 2>&1 | tee $OUT/issue14_plans.txt
#     bash benchmarks/device/issue14_pending.sh pair 2>&1 | tee $OUT/issue14_pair.txt
#
# What to read off: every check `ok`; the default plan should be the fastest or within the run-to-run swing (about
# 2%) of it. Two tiles a warp (fp4moe.PAIR_GEMMS, off until these lines) becomes the default for a GEMM where it wins
# past that swing at every batch timed, with the kernel level's step (benchmarks/simulate_gpu.py) to confirm.
set -u
export PYTHONPATH=workflow${PYTHONPATH:+:$PYTHONPATH}  # env.sh puts the carried wheels on it
probe() { echo "== moe_e_probe $*"; timeout 120 python3 benchmarks/device/moe_e_probe.py --only-table "$@"; }
group=${1:-}
case "$group" in
plans)

# TP8 (I = 256): 7 tokens just past one wave (the waves rule plans 9 splits where 8 tokens, under a wave, took 2)
probe --m 7 --split13 2 3 9
# TP8: 12 tokens (the rule's 5-6 splits against the warps rule's 2)
probe --m 12 --split13 2 5
# TP8: 48 tokens (3 splits against none)
probe --m 48 --split13 1 3
# TP1 (I = 2048): 3 and 6 tokens (3 and 2 splits against none)
probe --m 3 --i 2048 --split13 1 3
probe --m 6 --i 2048 --split13 1 2
# blocks of 16 pairs (past 8 pairs an expert: 2048 pairs over 256 experts), whose kernel holds 24 warps an SM, not
# 36 (fp4moe.RESIDENT_WARPS): 320 tokens, 2 splits planned, against none and 3
probe --m 320 --split13 1 2 3
# the early launch at batch 1 and 8 tokens (LAUNCH_EARLY; timed at 32 tokens only)
probe --m 1 --variants
probe --m 8 --variants
;;
pair)
# two tiles a warp (fp4moe PAIR: 72 registers, 7 programs an SM, 56 tiles in flight against 36), first where down
# read 0.57 of a plain read (TP8, 32 tokens), then the batches around it, TP1, and DeepSeek-V3's 7168 rows
probe --m 32 --pair down gate_up both
probe --m 8 --pair down gate_up both
probe --m 16 --pair down both
probe --m 64 --pair down both
probe --m 8 --i 2048 --pair down gate_up both
probe --m 32 --h 7168 --pair down both
;;
*)
echo "usage: bash $0 plans|pair (each under one device call's 600 s)" >&2
exit 2
;;
esac
