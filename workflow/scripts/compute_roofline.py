"""Adapter: compute_roofline rule -> decode_gap.roofline."""

from decode_gap.config import load_run
from decode_gap.io import write_json, write_table
from decode_gap.roofline import components_table, compute_roofline
from decode_gap.smk import run_script


def main(sm):
    p = sm.params.run
    run = load_run(sm.config)
    roof = p.get("roofline", {})
    result = compute_roofline(
        run.model,
        run.hardware,
        p["weight_format"],
        tp=p["tp"],
        ep=p.get("ep", 1),
        batch=p["batch_size"],
        context_len=p["context_len"],
        kv_cache_dtype=p.get("kv_cache_dtype", "auto"),
        layout=roof.get("layout", "even"),
        keep_bf16=tuple(roof.get("keep_bf16", [])),
        allreduce_latency_us=roof.get("allreduce_latency_us"),
        gguf_path=p.get("gguf_path") or None,
    )
    write_table(sm.output.components, components_table(result))
    write_json(sm.output.json, result)


run_script(snakemake, lambda: main(snakemake))  # noqa: F821
