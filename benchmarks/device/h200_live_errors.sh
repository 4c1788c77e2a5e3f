#!/usr/bin/env bash
# Issue 17 on one H200: what `transformers serve` answers to requests that fail, as the live stage reports it,
# and a small live run with and without `live.tokenizer` (the random model's own tokenizer.json).
# Wheels as for h200_pipeline.sh (.whl). Device: run(command="bash benchmarks/device/h200_live_errors.sh",
# carry=[".whl"], timeout_s=600). Prints everything; nothing to fetch back.
set -uo pipefail
source "$(dirname "$0")/env.sh"
MODEL_DIR=/tmp/llama-1b-random
python3 benchmarks/device/randmodel.py config/models/llama-1b-random.json "$MODEL_DIR" \
  >"$OUT/model.log" 2>&1 || tail -5 "$OUT/model.log"
setsid transformers serve "$MODEL_DIR" --host 127.0.0.1 --port 8000 --device cuda:0 --dtype bfloat16 \
  >"$OUT/serve.log" 2>&1 &
SERVER_PID=$!
trap 'kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null' EXIT
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
timeout 420 python3 benchmarks/device/live_error_probe.py http://127.0.0.1:8000/v1 --model "$MODEL_DIR" \
  --tokenizer "$MODEL_DIR"
echo "--- serve.log (errors) ---"
grep -iE "error|exception|traceback" "$OUT/serve.log" | head -20
