# Live streaming measurement against an OpenAI-compatible server (embedded llama.cpp when no endpoint is set).


rule measure_live:
    input:
        gguf=gguf_input,
    output:
        summary=res("live/summary.json"),
        requests=res("live/requests.parquet"),
        chunks=res("live/chunks.parquet"),
    # Logs, not outputs: Snakemake deletes a failed job's outputs, and these two explain the failure.
    log:
        res("logs/measure_live.log"),
        last_error=res("live/last_error.json"),
        server_log=res("live/embedded_server.log"),
    conda:
        "../../envs/decode-gap.yaml"
    # All cores: the embedded server uses them, and no other benchmark may run beside a latency measurement.
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(0),
    params:
        run=run_params("live"),
        fingerprint=stage_fingerprint("live"),
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
    conda:
        "../../envs/decode-gap.yaml"
    script:
        "../scripts/assemble_gguf.py"
