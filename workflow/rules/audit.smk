# System audit: host tunables, GPUs, PCIe, topology, versions; findings with fixes.
# Logic: workflow/decode_gap/audit/ (collect.py sources, parsers.py text parsers, findings.py rules).


rule collect_audit:
    output:
        json=res("audit.json"),
    log:
        res("logs/collect_audit.log"),
    conda:
        "../../envs/decode-gap.yaml"
    params:
        enabled=stage_enabled("audit"),
        min_kernel=config.get("audit", {}).get("min_kernel", "6.8"),
        fingerprint=stage_fingerprint("audit"),
    script:
        "../scripts/collect_audit.py"


rule audit:
    input:
        rules.collect_audit.output,
