# Which workflow to load: RENDER_ONLY when the target `render` is asked for (see workflow/rules/render.smk).
import sys


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


RENDER_ONLY = "render" in command_line_targets()
