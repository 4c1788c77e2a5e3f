# Micro-benchmark 'moe' at the model's per-GPU shapes -> microbench/moe.csv and moe.json.
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    run_stage("moe", snakemake.config, snakemake.output.csv, snakemake.output.json, memory_json=snakemake.input.memory)


run_script(snakemake, body, measures=True)
