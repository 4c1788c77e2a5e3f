# Adapter for rule collect_audit: audit this host (every field with its source) and write audit.json.
from decode_gap.audit.collect import collect_audit
from decode_gap.io import write_json
from decode_gap.smk import run_script


def body():
    params = {
        "enabled": snakemake.params.enabled,  # noqa: F821
        "min_kernel": snakemake.params.min_kernel,  # noqa: F821
        "api_key_env": snakemake.config.get("api_key_env", ""),  # noqa: F821
    }
    audit = collect_audit(params)
    write_json(snakemake.output.json, audit)  # noqa: F821
    print(f"audit: {audit['status']} on {audit.get('device', '-')}; findings {audit['summary']}")
    for f in audit["findings"]:
        print(f"[{f['severity']}] {f['id']}: {f['evidence']}\n    fix: {f['fix']}")
    for n in audit.get("not_checked", []):
        print(f"[not checked] {n['id']}: {n['why']}")


run_script(snakemake, body)  # noqa: F821
