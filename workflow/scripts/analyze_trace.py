# trace.json + trace_kernels.csv: the decode step from a torch.profiler trace (unavailable, with why, without one).
from decode_gap.smk import run_script


def body():
    from decode_gap.io import write_json, write_table
    from decode_gap.trace.analyze import stage_result

    p = snakemake.params  # noqa: F821
    result, kernels = stage_result(p.path, p.source)
    write_json(snakemake.output.json, result)  # noqa: F821
    write_table(snakemake.output.kernels, kernels)  # noqa: F821
    if result["status"] == "skipped":
        print(f"trace: unavailable: {result['reason']}")
    else:
        print(f"trace: {result['steps_used']} steps ({result['method']}): step {result['step_ms_median']} ms, "
              f"busy {result['gpu_busy_ms_median']} ms, idle {result['gpu_idle_ms_median']} ms, "
              f"{result['kernels_per_step_median']} kernels/step")


run_script(snakemake, body)  # noqa: F821
