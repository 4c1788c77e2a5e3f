# Adapter for rule render_report: read every stage file, write results/<hw-rev>/report.html and report.pdf.
from decode_gap.report.build import render_run
from decode_gap.smk import run_script

STAGE_INPUTS = [k for k in snakemake.input.keys() if k not in ("templates", "report_code")]  # noqa: F821


def body():
    sm = snakemake  # noqa: F821
    files = {name: str(getattr(sm.input, name)) for name in STAGE_INPUTS}
    ctx = render_run(
        files,
        sm.output.html,
        sm.output.pdf,
        hw_rev=sm.params.hardware_revision,
        fingerprint=dict(sm.params.fingerprint),
        config=dict(sm.config),
        archive_dir=sm.params.archive_dir,
        templates=list(sm.input.templates),
    )
    prov = ctx["provenance"]["counts"]
    print(f"report: {sm.output.html} and {sm.output.pdf}; {len(ctx['charts'])} charts; "
          f"figures: {prov['measured']} measured, {prov['modelled']} modelled, {prov['unavailable']} unavailable")
    for s in ctx["sections"]:
        if not s.get("ok"):
            print(f"  section {s['id']}: not measured: {s.get('why')}")


run_script(snakemake, body)  # noqa: F821
