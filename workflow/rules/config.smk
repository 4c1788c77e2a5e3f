# Shared by both workflows (measure and render): the installed package, the validated config, the templates.
# The package is installed by setup.sh (`pip install -e .`) and never put on sys.path from here, so the
# Snakefile, every script and every rank import the same package.
from snakemake.utils import validate

try:
    import decode_gap
except ImportError:
    sys.exit(
        f"decode-gap: error: package 'decode_gap' is not installed for {sys.executable}: "
        "run `bash setup.sh` (README) or `pip install -e .` in this checkout"
    )

PACKAGE_CHECKOUT = Path(decode_gap.__file__).resolve().parents[1]
if PACKAGE_CHECKOUT != (REPO / "workflow").resolve():
    print(
        f"decode-gap: note: the decode_gap package in use is {PACKAGE_CHECKOUT}, not this checkout's workflow/",
        file=sys.stderr,
    )


from decode_gap.config import one_line_validation_error, typed_cli_values

# A nested --config value's leaves come as strings (`stages={live: false}`): typed as the schema says first.
config.update(typed_cli_values(config))
# Relative to this file, as the Snakemake workflow template does; defaults in the schema fill `config`.
try:
    validate(config, "../schemas/config.schema.json")
except Exception as exc:
    sys.exit(
        one_line_validation_error(
            exc,
            [*workflow.configfiles, *workflow.config_settings.configfiles],
            dict(workflow.config_settings.config),
        )
    )


def report_templates(wildcards):
    """The report's Jinja2 templates, shipped inside the package: a template change re-renders the report."""
    from decode_gap.report.render import DEFAULT_TEMPLATES

    return sorted(str(p) for p in DEFAULT_TEMPLATES.glob("*.j2"))


def report_code(wildcards):
    """The report package's Python (how it reads the result files): a change to it re-renders the report, as a
    template change does; Snakemake's code trigger covers the rule's script only, not the modules it imports.
    """
    from decode_gap.report.render import DEFAULT_TEMPLATES

    return sorted(str(p) for p in DEFAULT_TEMPLATES.parent.rglob("*.py"))
