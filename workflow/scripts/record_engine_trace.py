# simulate/engine_trace.json.gz (+ .json): a torch.profiler trace of the engine level's decode steps.
from decode_gap.smk import run_script


def body():
    from decode_gap.simulate.engine_trace import engine_trace_stage

    engine_trace_stage(dict(snakemake.params.run), snakemake.output.trace, snakemake.output.json)  # noqa: F821


run_script(snakemake, body, measures=True)  # noqa: F821
