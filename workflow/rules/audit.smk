# System audit: host tunables, GPUs, PCIe, topology, versions; findings with fixes.


rule collect_audit:
    output:
        json=res("audit.json"),
    params:
        enabled=stage_enabled("audit"),
        min_kernel=config.get("audit", {}).get("min_kernel", "6.8"),
        fingerprint=stage_fingerprint("audit"),
    log:
        res("logs/collect_audit.log"),
    script:
        "../scripts/collect_audit.py"


rule audit:
    input:
        rules.collect_audit.output,
