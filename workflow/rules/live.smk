# Live streaming measurement against an OpenAI-compatible server (embedded llama.cpp when no endpoint is set).


rule measure_live:
    input:
        gguf=gguf_input,
    output:
        summary=res("live/summary.json"),
        requests=res("live/requests.parquet"),
        chunks=res("live/chunks.parquet"),
    params:
        run=run_params("live"),
        fingerprint=stage_fingerprint("live"),
    log:
        res("logs/measure_live.log"),
    resources:
        gpu=gpu_count_wanted(0),
    script:
        "../scripts/measure_live.py"


rule live:
    input:
        rules.measure_live.output,


rule assemble_gguf:
    output:
        EMBEDDED_GGUF,
    log:
        "resources/logs/assemble_gguf.log",
    localrule: True
    script:
        "../scripts/assemble_gguf.py"
