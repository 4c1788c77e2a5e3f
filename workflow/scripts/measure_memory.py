# Memory ceilings (copy/read bandwidth, peak matmul rate by dtype) -> microbench/memory.json.
from decode_gap.microbench.stages import run_stage
from decode_gap.smk import run_script

snakemake = snakemake  # noqa: F821  (injected by Snakemake)


def body():
    run_stage("memory", snakemake.config, None, snakemake.output.json)


run_script(snakemake, body, measures=True)
