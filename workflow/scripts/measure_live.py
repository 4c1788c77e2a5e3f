# Live streaming measurement: embedded llama.cpp server or the configured endpoint (see config/README.md#live).
from decode_gap.live.runner import LiveOutputs, LiveSettings, run_live
from decode_gap.smk import run_script


def body():
    out, log = snakemake.output, snakemake.log  # noqa: F821
    outputs = LiveOutputs(out.summary, out.requests, out.chunks, last_error=log.last_error, server_log=log.server_log)
    run_live(LiveSettings.from_params(snakemake.params.run), outputs)  # noqa: F821


run_script(snakemake, body, measures=True)  # noqa: F821
