# Render mode (target `render`): the report and its archive entry from a results/<hw-rev>/ tree measured on
# another host. Only this file and report.smk are included, so no measuring rule exists in the DAG: a stage
# file has no producer here and can never look out of date, whatever its mtime, params or code say. Nothing
# about this host is probed (no hardware, fingerprint or model resolution): the report shows the measuring
# host's figures, datasheet (roofline.json) and fingerprint (gap.json) only.
import sys
from pathlib import Path

REPO = Path(workflow.basedir)


include: "config.smk"


from decode_gap.errors import DecodeGapError
from decode_gap.report.copied import copied_results

try:
    COPIED = copied_results(REPO / "results", config.get("hardware_revision", ""))
except DecodeGapError as exc:
    sys.exit(f"decode-gap: error: render: {exc}")
HWREV = COPIED.hardware_revision
RES = f"results/{HWREV}"
FINGERPRINT = COPIED.fingerprint


def res(path):
    return f"{RES}/{path}"


include: "report.smk"


rule render:
    default_target: True
    input:
        rules.render_report.output,
        rules.archive_report.output,
