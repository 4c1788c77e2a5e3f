# Micro-benchmark 'attention' at the model's per-GPU shapes -> microbench/attention.csv and attention.json.
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    run_stage("attention", snakemake.config, snakemake.output.csv, snakemake.output.json, memory_json=snakemake.input.memory)


run_script(snakemake, body, measures=True)
