# decode-gap: where every millisecond of decode goes. Run: snakemake --cores all report
import sys

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


def command_line_targets():
    """The targets asked for. Snakemake 9 parses the Snakefile before it hands over its DAG settings, so they are
    read from the command line with Snakemake's own argument parser."""
    targets = getattr(getattr(workflow, "dag_settings", None), "targets", None)
    if targets:
        return set(targets)
    try:
        from snakemake.cli import get_argument_parser

        args, _ = get_argument_parser().parse_known_args(sys.argv[1:])
        return set(args.targets or ())
    except (Exception, SystemExit):
        return set()


# `snakemake render --config hardware_revision=<hw-rev>` renders a results tree copied from another host: its
# DAG holds only the rendering rules (workflow/rules/render.smk says why), so it can never measure this host.
RENDER_ONLY = "render" in command_line_targets()


if RENDER_ONLY:

    include: "workflow/rules/render.smk"

else:

    include: "workflow/rules/common.smk"
    include: "workflow/rules/audit.smk"
    include: "workflow/rules/roofline.smk"
    include: "workflow/rules/microbench.smk"
    include: "workflow/rules/simulate.smk"
    include: "workflow/rules/live.smk"
    include: "workflow/rules/gap.smk"
    include: "workflow/rules/report.smk"

    rule all:
        default_target: True
        input:
            rules.report.input,
