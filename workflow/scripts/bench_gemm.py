# Micro-benchmark 'gemm' at the model's per-GPU shapes -> microbench/gemm.csv and gemm.json.
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    run_stage("gemm", snakemake.config, snakemake.output.csv, snakemake.output.json, memory_json=snakemake.input.memory)


run_script(snakemake, body, measures=True)
