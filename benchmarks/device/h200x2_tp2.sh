#!/usr/bin/env bash
# TP=2 on two H200s (device kind nvidia-h200-x2), repeatably.
#
# Here, once:   the wheels of benchmarks/device/h200_pipeline.sh's header (.whl)
# Device:       run(command="bash benchmarks/device/h200x2_tp2.sh", carry=[".whl"], kind="nvidia-h200-x2", timeout_s=600)
# Back here:    tar xzf <files_at>/results.tgz results; then render as README "Render on another machine" says.
#
# Runs the all-reduce micro-benchmark at world size 2 (NCCL, eager and CUDA graph, the model's message size
# included), the roofline and the kernel-level decode step at TP=2 with the collective inside the step (eager
# and one CUDA graph that captures it), then every stage file the report reads. NVLink multicast stays off.
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m | head -5
trap 'tar czf "$OUT/results-tp2.tgz" results .snakemake/log 2>/dev/null' EXIT
CFG=benchmarks/device/${TP2_CONFIG:-h200x2-llama8b-tp2.yaml}
timeout ${TP2_TIMEOUT:-420} snakemake --cores 32 --keep-going ${TP2_TARGETS:-attribute_gap microbench} --configfile "$CFG" \
  >"$OUT/tp2.log" 2>&1; echo "tp2 pipeline rc=$?"
grep -h "decode-gap: error" "$OUT"/tp2.log | head -20
python3 benchmarks/tp_summary.py results/$(python3 -c "import yaml;print(yaml.safe_load(open('$CFG'))['hardware_revision'])") 2>&1 | tail -40
