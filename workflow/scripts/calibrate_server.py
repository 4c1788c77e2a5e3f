# Server level calibration: the HTTP/SSE stack's cost per streamed chunk, on loopback, without a model.
from decode_gap.smk import run_script


def body():
    from decode_gap.simulate.stage import server_stage

    params = dict(snakemake.params.run)  # noqa: F821
    params.update(live=dict(snakemake.params.live), endpoint=snakemake.params.endpoint)  # noqa: F821
    server_stage(params, snakemake.output.json)  # noqa: F821


run_script(snakemake, body, measures=True)  # noqa: F821
