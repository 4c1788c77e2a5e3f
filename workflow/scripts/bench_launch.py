# Micro-benchmark 'launch' at the model's per-GPU shapes -> microbench/launch.csv and launch.json.
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    run_stage("launch", snakemake.config, snakemake.output.csv, snakemake.output.json, memory_json=None)


run_script(snakemake, body, measures=True)
