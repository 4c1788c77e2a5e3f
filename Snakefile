# decode-gap: where every millisecond of decode goes. Run: snakemake --cores all report
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# `snakemake render --config hardware_revision=<hw-rev>` renders a results tree copied from another host: its
# DAG holds only the rendering rules (workflow/rules/render.smk says why), so it can never measure this host.
include: "workflow/rules/mode.smk"


if RENDER_ONLY:

    include: "workflow/rules/render.smk"

else:

    include: "workflow/rules/common.smk"
    include: "workflow/rules/audit.smk"
    include: "workflow/rules/roofline.smk"
    include: "workflow/rules/microbench.smk"
    include: "workflow/rules/simulate.smk"
    include: "workflow/rules/live.smk"
    include: "workflow/rules/trace.smk"
    include: "workflow/rules/gap.smk"
    include: "workflow/rules/report.smk"

    rule all:
        default_target: True
        input:
            rules.report.input,
