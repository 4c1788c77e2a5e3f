# Live streaming measurement: embedded llama.cpp server or the configured endpoint (see config/README.md#live).
from decode_gap.live.runner import LiveOutputs, LiveSettings, run_live
from decode_gap.smk import run_script


def body():
    out = snakemake.output  # noqa: F821
    run_live(LiveSettings.from_params(snakemake.params.run), LiveOutputs(out.summary, out.requests, out.chunks))  # noqa: F821


run_script(snakemake, body)  # noqa: F821
