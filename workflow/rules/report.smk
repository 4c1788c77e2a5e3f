# The HTML and PDF gap-analysis report, its archive copy, and the comparison of two archived runs.
from decode_gap import archive as archive_mod
from decode_gap.errors import DecodeGapError
from decode_gap.report.copied import ARCHIVED_FILES, present_files
from decode_gap.report.data import STAGE_FILES

# Render mode takes a copied tree as it is: an optional stage file it lacks is not an input.
REPORT_FILES = present_files(RES) if RENDER_ONLY else list(ARCHIVED_FILES)

ARCHIVE_DIR = config.get("archive", {}).get("dir", "report/archive")


try:
    COMPARE = archive_mod.compare_target(config, ARCHIVE_DIR, HWREV)
except DecodeGapError as exc:
    sys.exit(f"decode-gap: error: config fields run_a and run_b: {exc}")


# The stage files as plain paths: measuring rules produce them in a full run; in render mode (render.smk) no rule
# does, so Snakemake takes them as they are.
rule render_report:
    input:
        **{name: res(rel) for name, rel in STAGE_FILES.items() if rel in REPORT_FILES},
        templates=report_templates,
        report_code=report_code,
    output:
        html=res("report.html"),
        pdf=res("report.pdf"),
    log:
        res("logs/render_report.log"),
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    params:
        hardware_revision=HWREV,
        fingerprint=FINGERPRINT,
        archive_dir=ARCHIVE_DIR,
    script:
        "../scripts/render_report.py"


rule archive_report:
    input:
        html=rules.render_report.output.html,
        pdf=rules.render_report.output.pdf,
        stage_files=[res(rel) for rel in REPORT_FILES],
        templates=report_templates,
    output:
        receipt=res("archive.json"),
    log:
        res("logs/archive_report.log"),
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    params:
        hardware_revision=HWREV,
        fingerprint=FINGERPRINT,
        archive_dir=ARCHIVE_DIR,
    script:
        "../scripts/archive_report.py"


rule report:
    input:
        rules.render_report.output,
        rules.archive_report.output,


# snakemake --cores 1 compare --config run_a=<hw-rev>/<run-id> run_b=<hw-rev>/<run-id>  (or latest, previous, a path)
rule compare_runs:
    input:
        unpack(lambda wildcards: COMPARE.inputs),
        templates=report_templates,
        report_code=report_code,
    output:
        html=f"results/compare/{COMPARE.slug}.html",
        pdf=f"results/compare/{COMPARE.slug}.pdf",
    log:
        f"results/compare/logs/{COMPARE.slug}.log",
    localrule: True
    conda:
        "../../envs/decode-gap.yaml"
    params:
        a=COMPARE.spec_a,
        b=COMPARE.spec_b,
        archive_dir=ARCHIVE_DIR,
        hardware_revision=HWREV,
    script:
        "../scripts/compare_runs.py"


rule compare:
    input:
        rules.compare_runs.output,
