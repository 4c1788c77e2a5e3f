# Render mode (target `render`): the report and its archive entry from a results/<hw-rev>/ tree measured on
# another host. Only this file and report.smk are included, so no measuring rule exists in the DAG: a stage
# file has no producer here and can never look out of date, whatever its mtime, params or code say. Nothing
# about this host is probed (no hardware, fingerprint or model resolution): the report shows the measuring
# host's figures, datasheet (roofline.json) and fingerprint (gap.json) only.
import os
import sys
from pathlib import Path

from snakemake.utils import validate

REPO = Path(workflow.basedir)
# as common.smk: the scripts import the package from the checkout
PACKAGE_DIR = str(REPO / "workflow")
sys.path.insert(0, PACKAGE_DIR)
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        [PACKAGE_DIR, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
)

from decode_gap.config import one_line_validation_error
from decode_gap.errors import DecodeGapError
from decode_gap.report.copied import copied_results

try:
    validate(config, str(REPO / "config" / "config.schema.json"))
except Exception as exc:
    sys.exit(
        one_line_validation_error(
            exc,
            [*workflow.configfiles, *workflow.config_settings.configfiles],
            dict(workflow.config_settings.config),
        )
    )

try:
    COPIED = copied_results(REPO / "results", config.get("hardware_revision", ""))
except DecodeGapError as exc:
    sys.exit(f"decode-gap: error: render: {exc}")
HWREV = COPIED.hardware_revision
RES = f"results/{HWREV}"
FINGERPRINT = COPIED.fingerprint


def res(path):
    return f"{RES}/{path}"


def report_templates(wildcards):
    return sorted(str(p) for p in (REPO / "report" / "templates").glob("*.j2"))


include: "report.smk"


rule render:
    default_target: True
    input:
        rules.render_report.output,
        rules.archive_report.output,
