# Decode simulation at the kernel level (one step of real kernels) and the engine level (the engine's own forward).


rule simulate_kernel:
    input:
        allreduce=rules.bench_allreduce.output.json,
    output:
        json=res("simulate/kernel.json"),
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
    log:
        res("logs/simulate_kernel.log"),
    resources:
        gpu=gpu_count_wanted(config["tp"]),
    script:
        "../scripts/simulate_kernel.py"


rule simulate_engine:
    input:
        gguf=gguf_input,
    output:
        json=res("simulate/engine.json"),
    params:
        run=run_params("simulate"),
        fingerprint=stage_fingerprint("simulate"),
    log:
        res("logs/simulate_engine.log"),
    resources:
        gpu=gpu_count_wanted(1),
    script:
        "../scripts/simulate_engine.py"


rule merge_simulation:
    input:
        kernel=rules.simulate_kernel.output.json,
        engine=rules.simulate_engine.output.json,
    output:
        json=res("simulate.json"),
    log:
        res("logs/merge_simulation.log"),
    localrule: True
    script:
        "../scripts/merge_simulation.py"


rule simulate:
    input:
        rules.merge_simulation.output,
