# Trace: the decode step from a torch.profiler Chrome trace (config key `trace`: a file or a per-rank directory).
from decode_gap.trace.load import input_files as trace_input_files

TRACE_PATH = config.get("trace", "")
# No trace given and simulate.engine_trace on: the engine level records one of its own decode steps.
ENGINE_TRACE = not TRACE_PATH and bool(
    config.get("simulate", {}).get("engine_trace", False)
)


rule analyze_trace:
    input:
        trace=lambda wildcards: (
            [rules.record_engine_trace.output.trace]
            if ENGINE_TRACE
            else trace_input_files(TRACE_PATH)
        ),
    output:
        json=res("trace.json"),
        kernels=res("trace_kernels.csv"),
    log:
        res("logs/analyze_trace.log"),
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    params:
        path=res("simulate/engine_trace.json.gz") if ENGINE_TRACE else TRACE_PATH,
        source="engine-level" if ENGINE_TRACE else "file",
    script:
        "../scripts/analyze_trace.py"


rule trace:
    input:
        rules.analyze_trace.output,
