# Trace: the decode step from a torch.profiler Chrome trace (config key `trace`: a file or a per-rank directory).
from decode_gap.trace.load import input_files as trace_input_files

TRACE_PATH = config.get("trace", "")


rule analyze_trace:
    input:
        trace=lambda wildcards: trace_input_files(TRACE_PATH),
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
