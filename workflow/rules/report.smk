# The HTML and PDF gap-analysis report, its archive copy, and the comparison of two archived runs.
from decode_gap import archive as archive_mod
from decode_gap.errors import DecodeGapError

ARCHIVE_DIR = config.get("archive", {}).get("dir", "report/archive")


try:
    COMPARE = archive_mod.compare_target(config, ARCHIVE_DIR, HWREV)
except DecodeGapError as exc:
    sys.exit(f"decode-gap: error: config fields run_a and run_b: {exc}")


rule render_report:
    input:
        audit=rules.collect_audit.output.json,
        roofline=rules.compute_roofline.output.json,
        roofline_components=rules.compute_roofline.output.components,
        memory=rules.measure_memory.output.json,
        allreduce=rules.bench_allreduce.output.csv,
        allreduce_json=rules.bench_allreduce.output.json,
        gemm=rules.bench_gemm.output.csv,
        gemm_json=rules.bench_gemm.output.json,
        moe=rules.bench_moe.output.csv,
        moe_json=rules.bench_moe.output.json,
        attention=rules.bench_attention.output.csv,
        attention_json=rules.bench_attention.output.json,
        launch=rules.bench_launch.output.csv,
        launch_json=rules.bench_launch.output.json,
        simulate=rules.merge_simulation.output.json,
        live=rules.measure_live.output.summary,
        live_requests=rules.measure_live.output.requests,
        live_chunks=rules.measure_live.output.chunks,
        gap=rules.attribute_gap.output.json,
        trace=rules.analyze_trace.output.json,
        templates=report_templates,
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
        stage_files=stage_summaries,
        live_requests=rules.measure_live.output.requests,
        live_chunks=rules.measure_live.output.chunks,
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
