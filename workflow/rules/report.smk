# The HTML and PDF gap-analysis report, its archive copy, and the comparison of two archived runs.


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
        templates=report_templates,
    output:
        html=res("report.html"),
        pdf=res("report.pdf"),
    params:
        hardware_revision=HWREV,
        fingerprint=FINGERPRINT,
        archive_dir=config.get("archive", {}).get("dir", "report/archive"),
    log:
        res("logs/render_report.log"),
    localrule: True
    script:
        "../scripts/render_report.py"


rule archive_report:
    input:
        html=rules.render_report.output.html,
        pdf=rules.render_report.output.pdf,
        stage_files=stage_summaries,
    output:
        receipt=res("archive.json"),
    params:
        hardware_revision=HWREV,
        fingerprint=FINGERPRINT,
        archive_dir=config.get("archive", {}).get("dir", "report/archive"),
    log:
        res("logs/archive_report.log"),
    localrule: True
    script:
        "../scripts/archive_report.py"


rule report:
    input:
        rules.render_report.output,
        rules.archive_report.output,
