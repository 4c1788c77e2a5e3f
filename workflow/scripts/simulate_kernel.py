# Kernel level: one decode step of the configured model on this device (eager and one CUDA graph).
from decode_gap.smk import run_script


def body():
    from decode_gap.simulate.stage import kernel_stage

    kernel_stage(dict(snakemake.params.run), snakemake.input.get("allreduce"), snakemake.output.json)  # noqa: F821


run_script(snakemake, body, measures=True)  # noqa: F821
