# Adapter for rule archive_report: copy the report, stage files and fingerprint into the archive; write the receipt.
from decode_gap.report.build import archive_report
from decode_gap.smk import run_script


def body():
    sm = snakemake  # noqa: F821
    stage_files = [str(f) for f in sm.input.stage_files]
    stage_files += [str(getattr(sm.input, k)) for k in ("live_requests", "live_chunks") if k in sm.input.keys()]
    run = archive_report(
        html=str(sm.input.html),
        pdf=str(sm.input.pdf),
        stage_files=stage_files,
        receipt=sm.output.receipt,
        hw_rev=sm.params.hardware_revision,
        fingerprint=dict(sm.params.fingerprint),
        config=dict(sm.config),
        archive_dir=sm.params.archive_dir,
        templates=list(sm.input.templates),
    )
    print(f"archived run {run.run_id} to {run.path} ({len(run.meta.get('files', []))} files)")


run_script(snakemake, body)  # noqa: F821
