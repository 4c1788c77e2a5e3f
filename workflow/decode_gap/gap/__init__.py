"""Gap attribution: the waterfall from the roofline to the live inter-token latency, and the levers.

The waterfall is a chain of checkpoints, each a time one level of the stack takes per token:

    roofline (weights + KV at datasheet peak)            roofline.json
    + lost bandwidth: memory ceiling                      bytes / measured read bandwidth  (microbench/memory.json)
    + all-reduce                                          simulate kernel level (real) or allreduce.json (modelled)
    + lost bandwidth: kernels at decode shapes            kernel level, CUDA-graph time (simulate.json)
    + launch overhead                                     kernel level, eager - graph (0 for vLLM, SGLang, TGI;
                                                          unavailable where nothing tells how the server launches)
    + framework overhead                                  engine level (simulate.json) - kernel level
    + server overhead: completion loop                    engine level, in-process completion loop - eval
    + server overhead: HTTP/SSE streaming                 loopback calibration server (simulate.json server)
    = predicted ITL;   live ITL (live/summary.json);   unexplained residual = live - predicted

A checkpoint that is not available (no GPU for graphs, engine not measured, a kernel level that ran stand-in
dtypes for a format it cannot run) is listed with its reason, and the next available checkpoint's step absorbs
it under a combined name, so every millisecond up to the last checkpoint is still attributed to something that
was measured. The steps always sum exactly to the live ITL: the residual is defined as the remainder. A negative
residual (the levels predict more than the live server takes) is flagged, never hidden.

The server overhead model, and why closure is not circular. The issue defines server overhead as live ITL minus
the engine level; used as is, predicted = engine + (live - engine) = live, and closure would prove nothing. So
the model is built only from measurements that never look at the live stream:
  1. the completion loop: the server library's own per-token loop (for llama-cpp-python: create_completion with
     the server's request defaults, i.e. sampling over the whole vocabulary, penalties, detokenisation, chunk
     dicts) run in-process on the same model, minus llama.cpp's own eval time inside it (engine level);
  2. HTTP/SSE streaming. Where the engine can run in-process beside a stream (llama.cpp), the engine level runs
     the completion loop a second time while a loopback server on the same stack (Starlette/sse-starlette/
     uvicorn, no model) streams one chunk per engine step to a streaming client on the same host ("co-run"):
     the loop's slowdown is what the HTTP stack and the client cost the engine, core sharing included (on a
     small CPU host a preempted engine thread stalls every other one at the next barrier, which costs more
     than the CPU time taken). Otherwise the loopback calibration's CPU time per chunk is the model: the
     server process's share is serialised with the generation loop (GIL, one worker thread) and always
     counts; the client's share counts only when the engine already occupies every core.
The live ITL at concurrency 1 is then a prediction target the model never saw. live - engine is still reported,
labelled as the observed (circular) server overhead, for comparison only.

A negative step is a finding, not an explanation: when a lower level measures slower than the level above it
(kernel level above the engine level, levels that predict more than the live ITL), the step keeps its sign so
the chain still sums, but it is marked `inconsistent` with its size and likely cause, and it explains nothing.

Explained fraction = max(0, 1 - (|residual| + sum of |negative steps|) / live): the remainder and every
inconsistent millisecond count against it, so a +x step offset by a -x step lowers it by x / live instead of
cancelling. Closure ratio = predicted / live. Efficiency = roofline / live.

Never mix hosts: every level a step subtracts must come from the same device and hardware revision. A level
measured elsewhere (a kernel level re-run on the rendering laptop beside an H200 engine level) is refused: its
step becomes unavailable with both identities named, and the next level from the run's device absorbs it.
"""

from .attribute import attribute, attribute_files  # noqa: F401
from .hosts import explained_fraction, identity, run_identity  # noqa: F401
from .levels import live_itl, live_level, load_input  # noqa: F401
from .levers import rank_levers  # noqa: F401
from .rows import RESIDUAL, START, STEP, TOTAL, _num  # noqa: F401
from .steps import GRAPH_ENGINES  # noqa: F401

__all__ = ["GRAPH_ENGINES", "RESIDUAL", "START", "STEP", "TOTAL", "_num", "attribute", "attribute_files", "live_itl",
           "live_level", "load_input", "explained_fraction", "identity", "run_identity", "rank_levers"]
