# Shared helpers for all stages (config validation, hardware revision, fingerprint).
import sys
import time
from pathlib import Path

REPO = Path(workflow.basedir)


include: "config.smk"


from decode_gap.config import resolve_run
from decode_gap.errors import ConfigError
from decode_gap import fingerprint as fp
from decode_gap import fleet
from decode_gap import smk

try:
    RUN = resolve_run(config, REPO)
except ConfigError as exc:
    sys.exit(f"decode-gap: error: {exc}")
HWREV = RUN.hardware_revision
RES = f"results/{HWREV}"
# A timing rule's threads: all cores, so no other benchmark runs beside it (and a CPU host's micro-benchmarks get
# the threads the server they are held against has).
ALL_CORES = workflow.resource_settings.cores or 1
# On a cluster the submit host is not the node measured: the node's record from `fleet detect` is used.
FINGERPRINT, FINGERPRINT_BASIS = fp.for_dag(
    RES, RUN.server_identity, cluster=bool(workflow.non_local_exec)
)
if FINGERPRINT_BASIS.startswith("the submit host"):
    print(
        f"decode-gap: note: fingerprint taken on {FINGERPRINT_BASIS}", file=sys.stderr
    )


def stage_fingerprint(stage):
    """Params value that makes Snakemake rerun a stage when a component it depends on changes."""
    return fp.for_stage(FINGERPRINT, stage)


def stage_enabled(stage):
    return bool(config.get("stages", {}).get(stage, True))


def res(path):
    return f"{RES}/{path}"


EMBEDDED_GGUF = "resources/models/gemma-3-270m-q4_k_m.gguf"


def gguf_path():
    """The GGUF file in play: configured, or the embedded server's (assembled from its PyPI package)."""
    if config.get("gguf_path"):
        return config["gguf_path"]
    if config["weight_format"] == "gguf-q4_k_m" or (
        RUN.embedded_server and stage_enabled("live")
    ):
        return EMBEDDED_GGUF
    return ""


def gguf_input(wildcards):
    path = gguf_path()
    return [path] if path else []


def run_params(stage):
    """The config a stage's result depends on (a params change reruns the stage)."""
    keys = [
        "model",
        "weight_format",
        "hardware",
        "tp",
        "ep",
        "batch_size",
        "context_len",
        "kv_cache_dtype",
    ]
    out = {k: config.get(k) for k in keys}
    out["gguf_path"] = gguf_path()
    out["hardware_spec"] = RUN.hardware.key
    out["hardware_revision"] = HWREV
    out["enabled"] = (
        stage_enabled(stage)
        if stage in ("audit", "microbench", "simulate", "live")
        else True
    )
    if stage in ("roofline", "microbench", "simulate", "live"):
        out[stage] = config.get(stage, {})
    if stage == "live":
        out["endpoint"] = config.get("endpoint", "")
        out["api_key_env"] = config.get("api_key_env", "")
    if stage == "simulate":
        out["microbench"] = config.get("microbench", {})
    return out


def gpu_count_wanted(n):
    """GPUs a rule asks for (for --executor slurm); zero on a host without GPUs."""
    return n if RUN.hardware.kind == "gpu" else 0


def allreduce_resources():
    """GPUs (and nodes, for a multi-node all-reduce) the all-reduce benchmark asks a cluster for."""
    return fleet.allreduce_resources(config, RUN.hardware.kind == "gpu")


# Snakemake reports a failed job with its own traceback; the last lines then say what failed, one line a job, as
# each script ended its log (decode_gap.smk.run_script). Logs older than this run (less 2 s of clock skew) are not it.
RUN_STARTED = time.time() - 2


onerror:
    for line in smk.failed_job_lines(
        [f"{RES}/logs", "resources/logs"], RUN_STARTED
    ):
        print(line, file=sys.stderr)


onstart:
    # On a cluster the submit host is not the node type measured: auto-detection would describe the wrong machine.
    if (
        workflow.non_local_exec
        and workflow.is_main_process
        and (config["hardware"] == "auto" or not config.get("hardware_revision"))
    ):
        sys.exit(
            "decode-gap: error: config fields 'hardware' and 'hardware_revision': set both on a cluster "
            "(the submit host is not the node type measured); "
            "`PYTHONPATH=workflow python -m decode_gap.fleet detect -p <partition>` prints them (docs/slurm.md)"
        )


def this_host_devices():
    """The device names this host's stage files would record (as simulate/microbench write them)."""
    from decode_gap.host import host_identity

    ident = host_identity()
    return [*ident.gpu_names, f"cpu: {ident.cpu_model}"]


# Results copied from another host are rendered (target `render`), never measured into from this one (issue 15).
# On a cluster the submit host is not the node measured, so the check is left to the nodes' own runs.
if not workflow.non_local_exec and Path(RES, "gap.json").is_file():
    from decode_gap.report.copied import measured_elsewhere

    _elsewhere = measured_elsewhere(RES, this_host_devices())
    if _elsewhere:
        sys.exit(f"decode-gap: error: {_elsewhere}")
