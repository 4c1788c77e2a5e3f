# gap.json: the waterfall from the roofline to the live ITL, the closure ratio and the ranked levers.
from decode_gap.smk import run_script


def body():
    from decode_gap.config import public_run_config
    from decode_gap.gap import attribute_files
    from decode_gap.io import write_json

    i = snakemake.input  # noqa: F821
    keys = ("roofline", "memory", "allreduce", "gemm", "moe", "attention", "launch", "simulate", "live", "audit",
            "trace")
    p = snakemake.params  # noqa: F821
    result = attribute_files({k: i.get(k) for k in keys}, hardware_revision=p.hardware_revision,
                             fingerprint=dict(p.fingerprint), run_config=public_run_config(dict(snakemake.config)))  # noqa: F821
    write_json(snakemake.output.json, result)  # noqa: F821
    h = result["headline"]
    print(f"live ITL {result['live_itl_ms']} ms, predicted {result['predicted_ms']} ms, "
          f"closure {h['closure_ratio']}, explained {h['explained_fraction']}")
    for level, reason in result["refused_levels"].items():
        print(f"  refused {level}: {reason}")
    if h["inconsistency_note"]:
        print(f"  {h['inconsistency_note']}")


run_script(snakemake, body)  # noqa: F821
