"""Collect the host audit: every field with its source, or "unavailable: <why>" where a source cannot be read.

Sources, in order of preference where several can answer: sysfs/procfs, then tools (`lspci -vvv`, `lscpu`,
`nvidia-smi`), NVML through nvidia-ml-py (`pynvml`) for GPUs with `nvidia-smi -q` as the fallback, then psutil.
Nothing here raises for a missing source: in a VM or container most are missing, and the audit says so.
`Probe(root=...)` reads a fake root and `Probe(runner=...)` answers tool calls from fixture text, so tests can
replay a captured host.

Modules: probe.py (how a host is read: Probe, tool calls), system.py (host and tunables sections), gpus.py
(GPU and topology sections); this one collects software and environment and assembles the whole audit.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
from typing import Any, Mapping

from ..errors import describe
from ..provenance import skipped_stage
from .fields import env_snapshot, first, na, ok, scrub, secret_values, unavailable_map, value
from .gpus import GPU_CLASSES, NVIDIA_VENDOR, collect_gpus, collect_topology, nvml_gpus  # noqa: F401 - re-exported
from .parsers import DEEP_CSTATE_LATENCY_US  # noqa: F401 - re-exported; collect and findings share it
from .probe import Probe, ToolUnavailable, run_command  # noqa: F401 - re-exported
from .system import collect_host, collect_tunables  # noqa: F401 - re-exported

# ---------------------------------------------------------------- software and environment


def _dist(*names: str) -> dict[str, Any]:
    for name in names:
        try:
            return ok(importlib.metadata.version(name), f"pip metadata: {name}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return na(f"none of {', '.join(names)} installed", "pip metadata")


def collect_software(probe: Probe) -> dict[str, Any]:
    out: dict[str, Any] = {"python": ok(platform.python_version(), "platform.python_version")}
    nccl_dists = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
    if not probe.use_torch:
        why = "torch import not used"
        out.update(
            torch=na(why, "torch"), torch_cuda=na(why, "torch"), cuda_available=na(why, "torch"), nccl=na(why, "torch")
        )
        return out
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        why = f"import torch: {describe(exc, 300)}"
        out.update(torch=na(why, "torch"), torch_cuda=na(why, "torch"), cuda_available=na(why, "torch"))
        out["nccl"] = first(lambda: _dist(*nccl_dists))
        return out
    out["torch"] = ok(torch.__version__, "torch.__version__")
    out["torch_cuda"] = (
        ok(torch.version.cuda, "torch.version.cuda")
        if torch.version.cuda
        else na("torch is a CPU build", "torch.version.cuda")
    )
    avail = bool(torch.cuda.is_available())
    out["cuda_available"] = ok(avail, "torch.cuda.is_available")

    def nccl_torch() -> dict[str, Any]:
        if not avail:
            return na("no CUDA device visible to torch", "torch.cuda.nccl.version")
        v = torch.cuda.nccl.version()
        if isinstance(v, int):  # older torch: 22105 -> 2.21.5
            v = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
        return ok(".".join(str(p) for p in v), "torch.cuda.nccl.version")

    out["nccl"] = first(nccl_torch, lambda: _dist(*nccl_dists))
    return out


# ---------------------------------------------------------------- whole audit


def device_label(gpus: dict[str, Any], host: dict[str, Any]) -> str:
    names = [value(d["name"]) for d in gpus["devices"] if value(d["name"])]
    if names:
        return f"{names[0]} x{len(gpus['devices'])}"
    return f"cpu: {value(host['cpu_model'], 'unknown')}"


def collect_audit(
    params: Mapping[str, Any] | None = None,
    probe: Probe | None = None,
    now: _dt.datetime | None = None,
) -> dict[str, Any]:
    """The whole audit.json body (findings included). `params`: {"min_kernel", "api_key_env", "enabled"}."""
    from .findings import evaluate, summarize

    params = dict(params or {})
    probe = probe or Probe()
    if not params.get("enabled", True):
        why = "disabled in config (stages.audit)"
        return skipped_stage(
            "audit",
            why,
            findings=[],
            not_checked=[],
            summary=summarize([]),
            unavailable={},
            skipped=[{"case": "audit", "reason": why}],
        )
    host = collect_host(probe)
    gpus = collect_gpus(probe)
    audit: dict[str, Any] = {
        "stage": "audit",
        "status": "ok",
        "reason": "",
        "device": device_label(gpus, host),
        "collected_at": (now or _dt.datetime.now(_dt.timezone.utc)).isoformat(timespec="seconds"),
        "host": host,
        "tunables": collect_tunables(probe),
        "gpus": gpus,
        "topology": collect_topology(probe),
        "software": collect_software(probe),
        "env": ok(
            env_snapshot(probe.env), "environment (NCCL_*, CUDA_*, TORCH_*, PYTORCH_*; secret-looking names redacted)"
        ),
        "params": {"min_kernel": str(params.get("min_kernel", "6.8"))},
        "skipped": [],
    }
    result = evaluate(audit, min_kernel=audit["params"]["min_kernel"])
    audit["findings"] = result["findings"]
    audit["not_checked"] = result["not_checked"]
    audit["summary"] = summarize(result["findings"])
    audit["unavailable"] = unavailable_map(audit)
    api_env = params.get("api_key_env") or ""
    return scrub(audit, secret_values(probe.env, extra_names=(api_env,) if api_env else ()))
