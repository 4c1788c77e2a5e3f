# Micro-benchmarks: one rule each, so each caches and invalidates on its own.


rule measure_memory:
    output:
        json=res("microbench/memory.json"),
    log:
        res("logs/measure_memory.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/measure_memory.py"


rule bench_allreduce:
    output:
        csv=res("microbench/allreduce.csv"),
        json=res("microbench/allreduce.json"),
    log:
        res("logs/bench_allreduce.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        **allreduce_resources(),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/bench_allreduce.py"


rule bench_gemm:
    input:
        memory=rules.measure_memory.output.json,
    output:
        csv=res("microbench/gemm.csv"),
        json=res("microbench/gemm.json"),
    log:
        res("logs/bench_gemm.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/bench_gemm.py"


rule bench_moe:
    input:
        memory=rules.measure_memory.output.json,
    output:
        csv=res("microbench/moe.csv"),
        json=res("microbench/moe.json"),
    log:
        res("logs/bench_moe.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/bench_moe.py"


rule bench_attention:
    input:
        memory=rules.measure_memory.output.json,
    output:
        csv=res("microbench/attention.csv"),
        json=res("microbench/attention.json"),
    log:
        res("logs/bench_attention.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/bench_attention.py"


rule bench_launch:
    output:
        csv=res("microbench/launch.csv"),
        json=res("microbench/launch.json"),
    log:
        res("logs/bench_launch.log"),
    conda:
        "../../envs/decode-gap.yaml"
    threads: ALL_CORES
    resources:
        gpu=gpu_count_wanted(1),
    params:
        run=run_params("microbench"),
        fingerprint=stage_fingerprint("microbench"),
    script:
        "../scripts/bench_launch.py"


rule microbench:
    input:
        rules.measure_memory.output,
        rules.bench_allreduce.output,
        rules.bench_gemm.output,
        rules.bench_moe.output,
        rules.bench_attention.output,
        rules.bench_launch.output,
