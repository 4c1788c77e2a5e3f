"""Live streaming measurement against an OpenAI-compatible server (the `live` stage).

- `client`: one streamed request; a timestamp per network read, taken before any SSE or JSON parsing.
- `parse`: raw SSE events -> content chunks (completions and chat), usage, finish reason, errors.
- `tokens`: token count per chunk (server usage, else a tokenizer matched to the model, else one per chunk).
- `metrics`: vLLM `bench serve` statistics (ttft/tpot/itl/e2el) plus the per-token ITL.
- `identity`: server identity (`/v1/models`, headers, version endpoints) and engine detection.
- `server`: the embedded llama.cpp server (llama-cpp-python) started and always stopped by PID.
- `loopback`: the client's own per-chunk overhead, calibrated against a loopback SSE emitter.
- `settings`: LiveSettings (the run config), LiveOutputs (outputs and logs), table columns, secret scrubbing.
- `sweep`: the option probe, warm-up and concurrency levels (progress bar).
- `summary`: the stage result (per-level statistics, errors, server eval time) from the sweep.
- `runner`: the entry `run_live`: starts the embedded server, runs the sweep, writes the outputs.
"""
