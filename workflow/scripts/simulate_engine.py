# Engine level: the serving engine's own forward step, timed in-process on the same model.
from decode_gap.smk import run_script


def body():
    from decode_gap.simulate.stage import engine_stage

    params = dict(snakemake.params.run)  # noqa: F821
    params.update(live=dict(snakemake.params.live), endpoint=snakemake.params.endpoint)  # noqa: F821
    gguf = snakemake.input.get("gguf") or None  # noqa: F821
    engine_stage(params, str(gguf) if gguf else None, snakemake.output.json)  # noqa: F821


run_script(snakemake, body, measures=True)  # noqa: F821
