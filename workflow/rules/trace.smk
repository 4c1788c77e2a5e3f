# Trace: the decode step from a torch.profiler Chrome trace (config key `trace`: a file or a per-rank directory).
from decode_gap.trace.load import TRACE_SUFFIXES

TRACE_PATH = config.get("trace", "")


def trace_input(wildcards):
    """The trace files (so a new trace reruns the stage); none when unset or missing (the stage says why)."""
    p = Path(TRACE_PATH) if TRACE_PATH else None
    if p is None or not p.exists():
        return []
    if p.is_file():
        return [str(p)]
    return sorted(str(f) for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES))


rule analyze_trace:
    input:
        trace=trace_input,
    output:
        json=res("trace.json"),
        kernels=res("trace_kernels.csv"),
    log:
        res("logs/analyze_trace.log"),
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    params:
        path=TRACE_PATH,
        source="file",
    script:
        "../scripts/analyze_trace.py"


rule trace:
    input:
        rules.analyze_trace.output,
