# Adapter for rule compare_runs: a side-by-side HTML and PDF report of two archived runs (`--config a=... b=...`).
from decode_gap.report.build import render_compare
from decode_gap.smk import run_script


def body():
    sm = snakemake  # noqa: F821
    ctx = render_compare(
        sm.params.a,
        sm.params.b,
        sm.output.html,
        sm.output.pdf,
        archive_dir=sm.params.archive_dir,
        default_hw=sm.params.hardware_revision,
        templates=list(sm.input.templates),
    )
    print(f"compared {ctx['a']['label']} (A) with {ctx['b']['label']} (B): {sm.output.html}, {sm.output.pdf}")


run_script(snakemake, body)  # noqa: F821
