#!/usr/bin/env bash
# The whole pipeline on one H200, repeatably (the `device` tool runs this over a copy of the repo).
#
# Here, once:   ../shared/tools/device-wheels.sh .whl accelerate transformers fastapi uvicorn openai pydantic \
#                   httpx httpx-sse nvidia-ml-py psutil rich gguf tokenizers prometheus-client
#               (then drop the CUDA/torch wheels it pulls in: rm .whl/{nvidia_,triton-,cuda_,sympy-,networkx-}*)
# Device:       run(command="bash benchmarks/device/h200_pipeline.sh", carry=[".whl"], timeout_s=600)
# Back here:    tar xzf <files_at>/results.tgz results
#               for r in h200-transformers-llama1b h200-deepseek-v3-fp8; do \
#                 .venv/bin/snakemake --cores 1 render --config hardware_revision=$r; done
#               (the device has no pango for weasyprint; the `render` target loads only the rendering rules, so it
#               can never re-measure a stage here, whatever the tar's timestamps; README "Render on another machine")
#
# Env: DSV3=0 skips run (2); LLAMA_TIMEOUT (s, default 400) bounds run (1).
# Two runs: (1) `transformers serve` with a random-weight 1B Llama in bf16 as the live server, the same model at
# the kernel and engine levels (closure); (2) DeepSeek-V3 FP8 shapes for the micro-benchmarks and the kernel level.
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

MODEL_DIR=/tmp/llama-1b-random
python3 benchmarks/device/randmodel.py config/models/llama-1b-random.json "$MODEL_DIR" \
  >"$OUT/model.log" 2>&1 || tail -5 "$OUT/model.log"

setsid transformers serve "$MODEL_DIR" --host 127.0.0.1 --port 8000 --device cuda:0 --dtype bfloat16 \
  >"$OUT/serve.log" 2>&1 &
SERVER_PID=$!
stop_server() { kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null; }
trap 'stop_server; tar czf "$OUT/results.tgz" results/h200-* .snakemake/log 2>/dev/null' EXIT
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
curl -sf http://127.0.0.1:8000/health && echo " server ready"

# Every stage file the report reads, but not the report: it is rendered where weasyprint's pango exists.
timeout ${LLAMA_TIMEOUT:-400} snakemake --cores 16 --keep-going attribute_gap microbench --configfile benchmarks/device/h200-llama1b.yaml \
  >"$OUT/llama1b.log" 2>&1; echo "llama1b pipeline rc=$?"
stop_server
if [ "${DSV3:-1}" = 1 ]; then
  timeout 150 snakemake --cores 16 --keep-going attribute_gap microbench --configfile benchmarks/device/h200-dsv3.yaml \
    >"$OUT/dsv3.log" 2>&1; echo "dsv3 rc=$?"
fi
grep -h "decode-gap: error" "$OUT"/*.log | head -20
python3 benchmarks/closure.py results/h200-transformers-llama1b 2>&1 | tail -20 || true
