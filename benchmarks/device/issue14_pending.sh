#!/usr/bin/env bash
# The NVFP4 fused MoE's forms as the H200 timed them (issue 14; the 2026-12-04 and 12-05 stops), to run again after a
# change: device calls of one group each, each under the 600 s a call may take (a probe takes about 20-40 s: the
# experts built and quantised on the GPU, the kernels compiled, each form checked, then every form timed in rotated
# rounds; 120 s at most, or PROBE_S). Each moe_e_probe line checks, then times, the default plan (`all experts`)
# beside the forms named, GLM-5 shapes over the 256-expert table, CUDA graph after an L2 flush
# (benchmarks/device/moe_e_probe.py). Run from the repository root on the device:
#
#     bash benchmarks/device/issue14_pending.sh align 2>&1 | tee $OUT/issue14_align.txt
#     bash benchmarks/device/issue14_pending.sh pair 2>&1 | tee $OUT/issue14_pair.txt
#     bash benchmarks/device/issue14_pending.sh step $OUT/step 2>&1 | tee $OUT/issue14_step.txt
#     bash benchmarks/device/issue14_pending.sh defaults $OUT 2>&1 | tee $OUT/issue14_defaults.txt
#     bash benchmarks/device/issue14_pending.sh walk 2>&1 | tee $OUT/issue14_walk.txt
#     bash benchmarks/device/issue14_pending.sh walk_more 2>&1 | tee $OUT/issue14_walk_more.txt
#     bash benchmarks/device/issue14_pending.sh shared $OUT/shared b8 2>&1 | tee $OUT/issue14_shared_b8.txt
#     bash benchmarks/device/issue14_pending.sh shared $OUT/shared b32 2>&1 | tee $OUT/issue14_shared_b32.txt
#     bash benchmarks/device/issue14_pending.sh walk_check $OUT/walk 2>&1 | tee $OUT/issue14_walk_check.txt
#     bash benchmarks/device/issue14_pending.sh walk_small $OUT/walk_small 2>&1 | tee $OUT/issue14_walk_small.txt
#     bash benchmarks/device/issue14_pending.sh table $OUT 2>&1 | tee $OUT/issue14_table.txt
#     bash benchmarks/device/issue14_pending.sh topk_tail 2>&1 | tee $OUT/issue14_topk_tail.txt
#     bash benchmarks/device/issue14_pending.sh fp8_keys $OUT 2>&1 | tee $OUT/issue14_fp8_keys.txt
#     bash benchmarks/device/issue14_pending.sh fp8_keys_step $OUT 2>&1 | tee $OUT/issue14_fp8_keys_step.txt
#     bash benchmarks/device/issue14_pending.sh topk_synced $OUT 2>&1 | tee $OUT/issue14_topk_synced.txt
#     bash benchmarks/device/issue14_pending.sh topk_synced_step $OUT 2>&1 | tee $OUT/issue14_topk_synced_step.txt
#     bash benchmarks/device/issue14_pending.sh topk_warm 2>&1 | tee $OUT/issue14_topk_warm.txt
#     bash benchmarks/device/issue14_pending.sh rank $OUT 2>&1 | tee $OUT/issue14_rank.txt
#     bash benchmarks/device/issue14_pending.sh xring $OUT 2>&1 | tee $OUT/issue14_xring.txt
#     bash benchmarks/device/issue14_pending.sh pairs $OUT 2>&1 | tee $OUT/issue14_pairs.txt
#     bash benchmarks/device/issue14_pending.sh shortk $OUT 2>&1 | tee $OUT/issue14_shortk.txt
#     bash benchmarks/device/issue14_pending.sh stage 2>&1 | tee $OUT/issue14_stage.txt
#     bash benchmarks/device/issue14_pending.sh floors 2>&1 | tee $OUT/issue14_floors.txt
#     bash benchmarks/device/issue14_pending.sh imad $OUT 2>&1 | tee $OUT/issue14_imad.txt
#
# What to read off: every check `ok`. The forms are timed in rounds that rotate their order (the first form timed read
# 2-9% fast in a fixed order), so a form wins where its median is below the default's past the spread of the rounds.
# `plans` is the 2026-12-05 run of the split plans (kept to run again); `walk_check`, `defaults` and `shared` ran on
# an H200 on 2026-12-05 (the sixteenth session's note; fp4moe.DOWN_WALK's and simulate.step's comments hold them);
# `walk_small` on an H100 (fp4moe.DOWN_WALK_MIN_WAVES's comment).
set -u
export PYTHONPATH=workflow${PYTHONPATH:+:$PYTHONPATH}  # env.sh puts the carried wheels on it
probe() {  # PROBE_S: its time limit (120 s)
  echo "== moe_e_probe $*"
  timeout "${PROBE_S:-120}" python3 benchmarks/device/moe_e_probe.py --only-table "$@"
}
# steps_ab OUT ROWS NAME FILE FROM TO: the kernel level's GLM-5-NVFP4 TP8 step at each of ROWS (b8, b32) with this
# tree (OUT/this) and with a copy of workflow/ whose FILE has the line FROM as TO (OUT/NAME), this tree first
steps_ab() {
  local out=$1 rows=$2 name=$3 file=$4 from=$5 to=$6 copy=/tmp/wf_$3
  rm -rf "$copy" && cp -r workflow "$copy"
  sed -i "s/^$from\$/$to/" "$copy/$file"
  grep -q "^$to\$" "$copy/$file" || { echo "$from not found in $file" >&2; exit 2; }
  for r in $rows; do
    for wf in workflow "$copy"; do
      local form=this; [ "$wf" = workflow ] || form=$name
      echo "== step $r, $form"
      local case=kernel_glm5_tp8_nvfp4; [ "$r" = b1 ] || case+="_$r"
      python3 benchmarks/simulate_gpu.py "$out/$form" --cases "$case" --budget-s 140 --workflow "$wf"
    done
  done
}
group=${1:-}
case "$group" in
align)
# the align alone, sort against the atomic form, 1 to 1024 tokens (the sort: 58 us of a 375 us call at 320 tokens)
timeout 240 python3 benchmarks/device/align_probe.py
# the whole call with each form at 320 tokens (2560 pairs, blocks of 16) and 64 (512 pairs, blocks of 8)
probe --m 320 --align sort atomic
probe --m 64 --align sort atomic
;;
pair)
# down two tiles a warp, never split over K (the default since 2026-12-05, when this group confirmed it), rotated
# against one tile a warp at GLM-5 TP8 from 1 to 64 tokens, then TP4 (I = 512), TP1 (I = 2048) and DeepSeek-V3's rows
probe --m 1 --pair none
probe --m 8 --pair none
probe --m 16 --pair none
probe --m 32 --pair none both
probe --m 64 --pair none
probe --m 32 --i 512 --pair none
probe --m 8 --i 2048 --pair none
probe --m 32 --h 7168 --pair none
;;
step)
# the kernel level's GLM-5-NVFP4 TP8 step at 8 and 32 rows (benchmarks/simulate_gpu.py), down's pair on (this tree's
# default since 2026-12-05) and off (a copy of workflow/ with PAIR_GEMMS = "none"), b32 first
steps_ab "${2:?usage: $0 step OUT_DIR}" "b32 b8" no_pair decode_gap/kernels/fp4moe.py 'PAIR_GEMMS = "down"' \
  'PAIR_GEMMS = "none"'
;;
defaults)
# this tree's defaults on the GPU (the atomic align, down's pair): every kernel check of lowprec_device, the align
# from 8 to 1024 tokens, then down by pair (no atomics) against the default at 32, 128 and 320 tokens, and blocks of
# 8 pairs against 16 at 320, then the kernel level's step at 32 rows
out=${2:?usage: $0 defaults OUT_DIR}
timeout 200 python3 benchmarks/lowprec_device.py --out "$out/lp" --sections kernelchecks --budget-s 150 2>&1 | tail -25
timeout 90 python3 benchmarks/device/align_probe.py --tokens 8 320 1024 --rounds 3 2>&1 \
  | grep -E "==|sort|w4:|FAIL"
probe --m 1
probe --m 32 --down-by-pair
probe --m 128 --down-by-pair
probe --m 320 --down-by-pair --block-m 8 --pair none down
python3 benchmarks/simulate_gpu.py "$out/step" --cases kernel_glm5_tp8_nvfp4_b32 --budget-s 140
;;
walk)
# down at 320 tokens reads 0.45 of a plain read of its bytes: is it its programs (27 waves, two iterations each at
# K = 256, each behind its set-up's dependent loads) or its bytes? First the call with every expert expert 0's bytes
# (the weights from the L2: what is left is not DRAM), then down walking 2, 4 and 8 tile groups a program (one
# set-up, loads a group ahead: fp4moe.DOWN_WALK), then long programs (TP1, K = 2048) and down in 2 K splits, one
# tile a warp (the probes the 2026-12-05 note planned), and gate_up's pair there. Then the walk where blocks are 8
# pairs (96 registers where one group takes 72: 5 programs an SM for 7) and on DeepSeek-V3's rows (walk_more)
PROBE_S=240 probe --m 320 --l2-weights --walk 2 4 8
probe --m 320 --i 2048 --pair none
probe --m 320 --pair none --split2 2
# gate_up two tiles a warp too at 320 tokens (blocks of 16: x is two MMAs' columns a step, which the pair loads once
# for two tiles; it lost at 32 tokens, blocks of 8)
probe --m 320 --pair both
;;
walk_more)
probe --m 32 --walk 2 4 --l2-weights
probe --m 64 --walk 2 4
probe --m 32 --h 7168 --walk 2 4
;;
shared)
# the shared expert as one more expert of the NVFP4 fused MoE up to 32 rows (simulate.step.FUSE_SHARED_MAX_BATCH, the
# default since 2026-12-05, when this group, then the other way round, timed it): the kernel level's GLM-5-NVFP4 TP8
# step at 8 or 32 rows, fused (this tree) and apart (a copy of workflow/ with NVFP4's limit at 1)
steps_ab "${2:?usage: $0 shared OUT_DIR b8|b32}" "${3:?usage: $0 shared OUT_DIR b8|b32}" shared_apart \
  decode_gap/simulate/step.py 'FUSE_SHARED_MAX_BATCH = {"nvfp4-moe": 32, "fp8-moe": 1, "fp8-block-moe": 1}' \
  'FUSE_SHARED_MAX_BATCH = {"nvfp4-moe": 1, "fp8-moe": 1, "fp8-block-moe": 1}'
;;
walk_check)
# the walk by pairs a block (fp4moe.DOWN_WALK) where it was not timed: long programs, where it is not the default
# (DOWN_WALK_MAX_K_STEPS; TP1, K = 2048: 320 and 8 tokens, beside one tile a warp, which won at 320; TP4, K = 512),
# 128 tokens (blocks of 8, four pairs an expert) and 512 (blocks of 16), each against one group a program (--walk 1)
# and another walk; then the kernel level's step at 32 and 8 rows against a copy of workflow/ that walks nowhere
# (OUT/no_walk)
probe --m 320 --i 2048 --pair none --walk 1 2
probe --m 8 --i 2048 --pair none --walk 1 4
probe --m 32 --i 512 --walk 1 4
probe --m 128 --walk 1 4
probe --m 512 --walk 1 4
steps_ab "${2:?usage: $0 walk_check OUT_DIR}" "b32 b8" no_walk decode_gap/kernels/fp4moe.py \
  'DOWN_WALK = {8: 2, 16: 8}' 'DOWN_WALK = {8: 1, 16: 1}'
;;
walk_small)
# the walk where down's grid fits the SMs in one go (fp4moe.DOWN_WALK_MIN_WAVES: 1 since an H100 timed these probes
# on 2026-12-05): GLM-5 TP8 at 1, 2, 4 and 8 tokens and DeepSeek-V3's at 1, walking 1 and 2, then the kernel level's
# step at batch 1 unwalked (this tree) and walking (a copy with the limit at 0; untimed yet)
for m in 1 2 4 8; do probe --m $m --walk 1 2; done
probe --m 1 --h 7168 --walk 1 2
steps_ab "${2:?usage: $0 walk_small OUT_DIR}" b1 walk_all decode_gap/kernels/fp4moe.py 'DOWN_WALK_MIN_WAVES = 1' \
  'DOWN_WALK_MIN_WAVES = 0'
;;
table)
# the issue's table on this tree (lowprec_device's memory and Llama-3.1-8B sections: about 2 minutes; the H200 last
# ran it on 2026-12-04, before the split sums' zeroing waited on a barrier)
out=${2:?usage: $0 table OUT_DIR}
timeout 300 python3 benchmarks/lowprec_device.py --out "$out/lp" --sections memory,llama --budget-s 240 2>&1 | tail -40
;;
topk_tail)
# the DSA top-k's one program with a tail block (kernels/topk.py: the default past 4096 scores since an H100 timed
# this group on 2026-12-06, topk.MAX_TAIL's comment): rows just past 4096 against the multi-pass form, then the
# kernel level's attention at a 4096-token context kernel by kernel (4097 scores: the step times both forms at
# build and keeps the faster)
timeout 150 python3 benchmarks/device/topk_probe.py --rows 1,8 --lengths 4096,4097,5120,6144 --chunks 2048 --digits 8
timeout 150 python3 benchmarks/device/step_profile.py --context 4096 --components attention
timeout 150 python3 benchmarks/device/step_profile.py --context 4096 --batch 8 --components attention
;;
topk_synced)
# the DSA top-k past 6144 scores: the multi-pass form in one launch (its chunks meeting at a barrier in L2 after each
# pass; kernels/topk.py, 2026-12-06) against the five launches with PDL, 1 and 8 rows, chunks of 1024 to 4096 scores,
# 8- and 11-bit digits; every kernel check (the one-launch form's at 8192 to 131072 scores among them); then the
# kernel level's attention at a 32768-token context kernel by kernel (the step times the forms at build, keeps the
# fastest)
timeout 230 python3 benchmarks/device/topk_probe.py --rows 1,8 --lengths 8192,32768,65536,131072 \
  --chunks 1024,2048,4096 --digits 8,11 --pdl 1
timeout 200 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 topk_synced OUT_DIR}/lp" \
  --sections kernelchecks --budget-s 150 2>&1 | grep -E "checks:|FAILED|top-k" | tail -12
timeout 140 python3 benchmarks/device/step_profile.py --context 32768 --components attention
;;
topk_synced_step)
# the one-launch top-k's early stop (2026-12-06): the probe's 8-bit forms again, then the attention component at a
# 32768-token context for 1 and 8 rows (the picker's times for every top-k form printed), with every kernel check
# between
timeout 150 python3 benchmarks/device/topk_probe.py --rows 1,8 --lengths 8192,32768,131072 --chunks 1024,2048 \
  --digits 8 --pdl 1
timeout 150 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 topk_synced_step OUT_DIR}/lp" \
  --sections kernelchecks --budget-s 120 2>&1 | grep -E "checks:|FAILED" | tail -3
timeout 140 python3 benchmarks/device/step_profile.py --context 32768 --components attention
timeout 140 python3 benchmarks/device/step_profile.py --context 32768 --batch 8 --components attention
;;
topk_warm)
# the kernel level's picker times the DSA top-k with the scores left in L2 (KernelPicker.pick's inputs_in_l2,
# 2026-12-07), as the scores kernel leaves them in the step: the attention component at 4096 and 8192 tokens with
# this tree, then at 4096 with a copy that offers the one-launch form from 4097 scores (topk.SYNCED_FROM = MAX_ROW),
# where the picker's flushed timing ranked it first and the layer was slower with it (2026-12-06, H100)
copy=/tmp/wf_synced_4097
rm -rf "$copy" && cp -r workflow "$copy"
sed -i 's/^SYNCED_FROM = MAX_ROW + MAX_TAIL$/SYNCED_FROM = MAX_ROW/' "$copy/decode_gap/kernels/topk.py"
grep -q '^SYNCED_FROM = MAX_ROW$' "$copy/decode_gap/kernels/topk.py" || { echo "SYNCED_FROM not found" >&2; exit 2; }
for args in "--context 4096" "--context 8192" "--context 4096 --workflow $copy" "--context 4096 --batch 8" \
    "--context 4096 --batch 8 --workflow $copy"; do
  echo "== step_profile $args"
  timeout 140 python3 benchmarks/device/step_profile.py $args --components attention
done
;;
rank)
# the DSA top-k's pairwise rank (kernels/topk.py; an H100 ran this group on 2026-12-06, topk.RANK_BLOCK_J's comment):
# its blocks against the radix select's forms at 1 and 8 rows of 4097 to 12288 scores, every kernel check (the
# rank's among them), then the attention component kernel by kernel at 4096 and 8192 tokens (1 row: the picker took
# the rank) and at 4096 for 8 rows (it kept the tail block)
timeout 120 python3 benchmarks/device/topk_probe.py --rows 1,8 --lengths 4097,8193,12288 --chunks 2048 --digits 8 \
  --pdl 1 --rank 8x256,4x256,8x128,16x256
timeout 220 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 rank OUT_DIR}/lp" --sections kernelchecks \
  --budget-s 170 2>&1 | grep -E "checks:|FAILED|top-k" | tail -12
for args in "--context 4096" "--context 8192" "--context 4096 --batch 8"; do
  echo "== step_profile $args"
  timeout 100 python3 benchmarks/device/step_profile.py $args --components attention
done
;;
xring)
# x through a ring of cp.async copies at M = 9-16 (lowprec.FP4_MMA_XRING, through L1 since an H100 timed the L2-only
# copies slower on 2026-12-06; the L1 copies it then timed 2-3% ahead of the plan's form on the large shapes, one
# sweep each; the plan takes it 2 deep on every split and on stream-K since 2026-12-07, when an H100 timed it ahead on
# all seven shapes at M = 9-16, lowprec.FP4_RING's comment): checked, then timed beside the plan without the ring,
# with the ring 3 deep and xshare's forms on split and stream-K shapes (4 to 28 iterations a split) in 5 rounds that
# rotate their order (the project's rule for a default), then ncu's stall reasons for both on 28672x4096. An H200
# ran it on 2026-12-07: the plan the fastest or within 0.2-2.3% on all 21 cases (lowprec.FP4_RING's comment)
timeout 280 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 xring OUT_DIR}/xr" --sections memory,sweep \
  --forms xring --shapes 28672x4096,36864x7168,7168x18432,6144x4096,4096x14336,24576x6144,6144x16384 --ms 16,12,9 \
  --rounds 5 --budget-s 250 2>&1 | grep -E "sweep|FAIL|rror|read|rounds"
timeout 150 bash benchmarks/device/ncu_xtraffic.sh "28672 4096 16 xs" "28672 4096 16 xr2" 2>&1 | tail -44
;;
pairs)
# tile pairs on a short K split at M = 9-12 (lowprec.FP4_PAIR_MAX_M: the plan since 2026-12-07, from an H100's rounds
# on twelve TP1-TP8 shapes): checked, then timed beside the ring's split form and the rest of --forms pair in 5 rotated
# rounds, at M = 9, 12 and 16 (where the plan keeps the ring). An H200 ran it on 2026-12-07 (lowprec.FP4_PAIR_MAX_M's
# comment: tile pairs the fastest at M = 9-12, and at M=16 on seven of the nine, where the H100 disagreed)
timeout 280 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 pairs OUT_DIR}/pairs" --sections memory,sweep \
  --forms pair --shapes 6144x4096,4096x4096,3072x6144,4608x7168,7168x2304,3584x4096,4096x7168,6144x1536,7168x4608 \
  --ms 9,12,16 --rounds 5 --budget-s 250 2>&1 | grep -E "sweep|FAIL|rror|read|rounds"
;;
shortk)
# a short K at M = 9-16 whose K split would overflow a wave even cut to two (lowprec.FP4_SLICED_MAX_STEPS: the
# K-sliced form since an H100's rounds on 2026-12-07, where stream-K was the plan): checked, then timed beside
# stream-K with the ring, tile pairs and the rest of --forms pair in 5 rotated rounds. An H200 ran it on 2026-12-07:
# tile pairs the fastest on all nine cases, by 4-19% (the comment above lowprec.FP4_M16_SHORT_K)
timeout 280 python3 benchmarks/lowprec_device.py --out "${2:?usage: $0 shortk OUT_DIR}/shortk" --sections memory,sweep \
  --forms pair --shapes 32768x512,36864x512,32768x1024 --ms 9,12,16 --rounds 5 --budget-s 250 2>&1 \
  | grep -E "sweep|FAIL|rror|read|rounds"
;;
stage)
# x staged whole a program at M = 9-16 (benchmarks/device/stage_probe.py: no barrier in the loop), the geometries
# that came closest on an H100 on 2026-12-07 (0.6-5.2% behind the plan at M = 16, level to 3% ahead at M = 9, left
# out): checked, then timed beside the plan in 3 rotated rounds. On an H200 (2026-12-07) only 28672x4096 at M=16 ran,
# with --l2: behind the plan as it runs and with no DRAM traffic (stage_probe.py's docstring), so the H200's faster
# memory does not move the balance there
timeout 500 python3 benchmarks/device/stage_probe.py --ms 16,9 --rounds 3 \
  --shapes 28672x4096,7168x18432,36864x7168,24576x6144,6144x16384 --geometries 8:16:4:4:64,8:16:4:1:64,8:16:3:1:0 \
  2>&1 | grep -E "x[0-9]+ +M=|read|FAIL|rror"
;;
floors)
# the NVFP4 GEMV's loops with no DRAM traffic at M = 1, 8 and 16 (ablate_probe.py's L2 way: the SMs' own time, the same
# on an H100 and an H200, 2026-12-07), then ncu's stall reasons for M = 16 and M = 8 (ncu_ablate.sh): what a change
# meant to make M = 9-16's loop cheaper must lower, measurable on either card
timeout 200 python3 benchmarks/device/ablate_probe.py --m 1 8 16 --shapes 28672x4096 7168x18432 36864x7168 4096x14336
timeout 150 bash benchmarks/device/ncu_ablate.sh "28672x4096 16 plan L2" "28672x4096 8 plan L2"
;;
imad)
# the decode's multiply (lowprec.FP4_DECODE_IMAD: a plane whose sign and magnitude move apart in 3 operations, not 4)
# against the two shifts it replaced: every kernel check on this tree, then the plan's loops as they run and with no
# DRAM traffic (ablate_probe.py's base and L2 ways) with this tree and with a copy whose FP4_DECODE_IMAD is False, in
# the order new, old, old, new (ROUNDS=1: new, old). Ran on an H100 on 2026-12-08 (lowprec's FP4_DECODE_IMAD comment
# holds the figures); still to run on an H200
timeout 200 python3 benchmarks/lowprec_device.py --out "${2:-/tmp}/lp" --sections kernelchecks --budget-s 150 2>&1 \
  | grep -E "checks:|FAILED" | tail -3
rm -rf /tmp/noimad && mkdir -p /tmp/noimad && cp -r workflow benchmarks /tmp/noimad/
sed -i 's/^FP4_DECODE_IMAD = True$/FP4_DECODE_IMAD = False/' /tmp/noimad/workflow/decode_gap/kernels/lowprec.py
grep -q "^FP4_DECODE_IMAD = False$" /tmp/noimad/workflow/decode_gap/kernels/lowprec.py \
  || { echo "no FP4_DECODE_IMAD" >&2; exit 2; }
order=". /tmp/noimad /tmp/noimad ."; [ "${ROUNDS:-2}" = 1 ] && order=". /tmp/noimad"
for tree in $order; do
  echo "== $( [ "$tree" = . ] && echo imad || echo shifts )"
  timeout 150 python3 "$tree/benchmarks/device/ablate_probe.py" --m 1 16 --shapes 28672x4096 7168x18432 4096x14336
done
;;
fp8_keys|fp8_keys_step)
# the DSA indexer's FP8 keys and queries (kernels/attention.py; run on an H100 and an H200 on 2026-12-06, the
# figures in index_scores' and index_prepare's docstrings): every kernel check (the FP8 indexer's among them), then
# the attention component kernel by kernel at 4096 and 32768 tokens with FP8 keys (this tree) and bf16 keys (a copy
# whose step caches bf16); with
# `fp8_keys_step`, the kernel level's GLM-5-NVFP4 TP8 step at 1 and 8 rows both ways instead (each under 600 s)
out=${2:?usage: $0 fp8_keys|fp8_keys_step OUT_DIR}
from='            icache = _rand((M, self.T, ID), self.act, self.device).to(attn_kernels.INDEX_KEY_DTYPE)'
to='            icache = _rand((M, self.T, ID), self.act, self.device)'
rm -rf /tmp/wf_bf16_keys && cp -r workflow /tmp/wf_bf16_keys
sed -i "s/^$from\$/$to/" /tmp/wf_bf16_keys/decode_gap/simulate/step.py
grep -q "^$to\$" /tmp/wf_bf16_keys/decode_gap/simulate/step.py || { echo "the FP8 cache line not found" >&2; exit 2; }
if [ "$group" = fp8_keys_step ]; then
  steps_ab "$out" "b1 b8" bf16_keys decode_gap/simulate/step.py "$from" "$to"
  exit
fi
timeout 200 python3 benchmarks/lowprec_device.py --out "$out/lp" --sections kernelchecks --budget-s 150 2>&1 \
  | grep -E "checks:|FAILED" | tail -3
# and at 32768 a copy whose scores kernel takes the heads as the MMA's M (warp MMA on fp16 casts where the tree's
# takes the cache's rows: wgmma in FP8; 2026-12-06)
rm -rf /tmp/wf_heads_m && cp -r workflow /tmp/wf_heads_m
python3 - /tmp/wf_heads_m/decode_gap/kernels/attention.py <<'PY' || exit 2
import sys
p = sys.argv[1]
s = open(p).read()
new = ("        s = tl.maximum(tl.dot(qh, tl.trans(k.to(qh.dtype))), 0.0)\n"
       "        if SCALED:\n"
       "            s = s * tl.load(kscale + m * stride_sm + ts, mask=tmask, other=0.0)[None, :]\n"
       "        tl.store(out + m * stride_om + ts, tl.sum(s * w[:, None], axis=0), mask=tmask)\n")
a = s.index("        s = tl.maximum(tl.dot(k.to(qh.dtype), tl.trans(qh)), 0.0)")
b = s.index("axis=1), mask=tmask)\n", a) + len("axis=1), mask=tmask)\n")
open(p, "w").write(s[:a] + new + s[b:])
PY
for ctx in 4096 32768; do
  for wf in workflow /tmp/wf_bf16_keys $([ $ctx = 32768 ] && echo /tmp/wf_heads_m); do
    echo "== attention at $ctx tokens, $wf"
    timeout 100 python3 benchmarks/device/step_profile.py --context $ctx --components attention --workflow "$wf" \
      2>&1 | tail -20
  done
done
;;
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
*)
echo "usage: bash $0 align|pair|step OUT_DIR|defaults OUT_DIR|walk|walk_more|shared OUT_DIR b8|b32" \
  "|walk_check OUT_DIR|walk_small OUT_DIR|table OUT_DIR|topk_tail|fp8_keys[_step] OUT_DIR|plans" \
  "|topk_synced[_step] OUT_DIR|topk_warm|rank OUT_DIR|xring OUT_DIR|pairs OUT_DIR|shortk OUT_DIR|stage|floors" \
  "(each under one device call's 600 s)" >&2
exit 2
;;
esac
