# simulate.json: the kernel, engine and server-calibration levels in one file.
from decode_gap.smk import run_script


def body():
    from decode_gap.simulate.stage import merge

    i = snakemake.input  # noqa: F821
    merge(i.kernel, i.engine, i.server, snakemake.output.json)  # noqa: F821


run_script(snakemake, body)  # noqa: F821
