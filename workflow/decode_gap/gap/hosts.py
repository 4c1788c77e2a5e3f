"""Where each level was measured, levels that may not be set against each other, and negative steps."""

from __future__ import annotations

from typing import Any

# Levels whose files name the accelerator they ran on (the HTTP calibration is a CPU measurement by design and
# the live client cannot see the server's device, so those two are compared by hardware revision only).
DEVICE_LEVELS = ("memory", "allreduce", "gemm", "moe", "attention", "launch", "kernel", "engine")


def _concrete(device: str) -> bool:
    return bool(device) and not device.startswith("server at")


def identity(doc: dict | None, source: str) -> dict[str, Any] | None:
    """{source, device, hardware_revision} a stage file records (None when the file is unavailable)."""
    if not isinstance(doc, dict):
        return None
    return {"source": source, "device": str(doc.get("device") or ""),
            "hardware_revision": str(doc.get("hardware_revision") or "") or None}


def identity_text(ident: dict | None) -> str:
    if not ident:
        return "not recorded"
    parts = [ident.get("device") or "device not recorded"]
    if ident.get("hardware_revision"):
        parts.append(f"rev {ident['hardware_revision']}")
    return ", ".join(parts)


def run_identity(ids: dict[str, dict | None], expected_rev: str | None) -> dict[str, Any]:
    """The device and revision the run was measured on: the device most levels name (the engine's on a tie)."""
    counts: dict[str, int] = {}
    for key in DEVICE_LEVELS:
        dev = (ids.get(key) or {}).get("device", "")
        if _concrete(dev):
            counts[dev] = counts.get(dev, 0) + 1
    engine_dev = (ids.get("engine") or {}).get("device", "")
    device = max(counts, key=lambda d: (counts[d], d == engine_dev)) if counts else ""
    return {"device": device, "hardware_revision": expected_rev or None}


def foreign(ident: dict | None, ref: dict[str, Any], by_device: bool) -> str:
    """Why a level cannot be set against the run's other levels ('' when it can)."""
    if not ident:
        return ""
    rev, want_rev = ident.get("hardware_revision"), ref.get("hardware_revision")
    if rev and want_rev and rev != want_rev:
        return f"{ident['source']} was measured on hardware revision {rev}, this run is {want_rev}"
    dev, want = ident.get("device", ""), ref.get("device", "")
    if by_device and _concrete(dev) and want and dev != want:
        return f"{ident['source']} was measured on {dev}, the run's other levels on {want}"
    return ""


# Likely causes of a negative step, by step (the step name before any " + " of absorbed levels).
NEGATIVE_CAUSE = {
    "lost bandwidth: memory ceiling": "measured bandwidth above the datasheet peak: a cache-resident benchmark "
                                      "buffer or a datasheet that does not match the part",
    "lost bandwidth: kernels at decode shapes": "the kernel level moves fewer bytes than the roofline counts "
                                                "(layers scaled, weights cached in L2) or the memory benchmark "
                                                "under-measures bandwidth",
    "launch overhead": "the CUDA-graph replay measured slower than eager launches: timing noise or a graph that "
                       "captured extra work",
    "framework overhead": "the kernel level measured slower than the engine running the same model: different "
                          "kernels, dtype or shapes at the kernel level, or levels from different hosts",
    "server overhead: completion loop": "the completion loop measured faster than the engine's own eval: noise",
    "server overhead: HTTP/SSE streaming": "the co-run measured faster than the loop alone: noise",
    "unexplained residual": "the levels predict more than the live server takes: a modelled step over-counts, or "
                            "the live server runs faster kernels or graphs than the engine level",
}


def _flag_negative(row: dict[str, Any], what: str) -> None:
    """Mark a negative step as an inconsistency: its size, what measured slower than what, the likely cause."""
    if row.get("ms") is None or row["ms"] >= 0:
        return
    base = row["name"].split(" + ")[-1]
    row["inconsistent"] = True
    row["inconsistency"] = {
        "ms": -row["ms"],
        "what": what,
        "likely_cause": NEGATIVE_CAUSE.get(base, "a lower level measured slower than a higher one"),
    }


def _measured_on(source: str, ids: dict[str, dict | None], refused: dict[str, str]) -> str:
    """Where a waterfall row's figure was measured, from the stage file its source names."""
    for prefix, key in (("microbench/memory", "memory"), ("microbench/allreduce", "allreduce"),
                        ("simulate.json (kernel", "kernel"), ("simulate.json (engine", "engine"),
                        ("simulate.json (server", "server"), ("live/summary", "live")):
        if prefix in source:
            text = identity_text(ids.get(key))
            return f"{text} (refused)" if key in refused else text
    return "no host: modelled from the datasheet and the model" if source.startswith("roofline") else ""


def explained_fraction(residual: float | None, itl: float | None, inconsistent_ms: float) -> float | None:
    """max(0, 1 - (|residual| + inconsistent ms) / live): offsetting steps never raise it."""
    if residual is None or not itl:
        return None
    return max(0.0, 1.0 - (abs(residual) + inconsistent_ms) / itl)
