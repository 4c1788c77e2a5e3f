# Decode simulation at the kernel level (one step of real kernels), the engine level (the engine's own forward)
# and the server's HTTP/SSE stack (a loopback calibration without a model).


rule simulate_kernel:
    input:
        allreduce=rules.bench_allreduce.output.json,
    output:
        json=res("simulate/kernel.json"),
    log:
        res("logs/simulate_kernel.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(config["tp"]),
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
    script:
        "../scripts/simulate_kernel.py"


rule simulate_engine:
    input:
        gguf=gguf_input,
    output:
        json=res("simulate/engine.json"),
    log:
        res("logs/simulate_engine.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
        live=config.get("live", {}),
        endpoint=config.get("endpoint", ""),
    script:
        "../scripts/simulate_engine.py"


rule calibrate_server:
    output:
        json=res("simulate/server.json"),
    log:
        res("logs/calibrate_server.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
        live=config.get("live", {}),
        endpoint=config.get("endpoint", ""),
    script:
        "../scripts/calibrate_server.py"


rule merge_simulation:
    input:
        kernel=rules.simulate_kernel.output.json,
        engine=rules.simulate_engine.output.json,
        server=rules.calibrate_server.output.json,
    output:
        json=res("simulate.json"),
    log:
        res("logs/merge_simulation.log"),
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    script:
        "../scripts/merge_simulation.py"


rule simulate:
    input:
        rules.merge_simulation.output,


rule record_engine_trace:
    output:
        trace=res("simulate/engine_trace.json.gz"),
        json=res("simulate/engine_trace.json"),
    log:
        res("logs/record_engine_trace.log"),
    conda:
        "../../envs/decode-gap.yaml"
    # All cores: the unprofiled step time beside the trace is a latency measurement.
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
    script:
        "../scripts/record_engine_trace.py"
