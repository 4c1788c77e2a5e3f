"""The simulate stage's entry points, called by the thin scripts in workflow/scripts/.

simulate_kernel -> simulate/kernel.json, simulate_engine -> simulate/engine.json,
calibrate_server -> simulate/server.json, merge_simulation -> simulate.json {kernel, engine, server}.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from ..config import repo_path, with_defaults
from ..errors import ConfigError, DecodeGapError, describe
from ..settings import LiveSettings
from ..io import read_json, read_stage_json, write_json
from ..model import load_model_card
from ..provenance import figure_value, skipped_stage

def sim_config(params: dict[str, Any]) -> dict[str, Any]:
    """The `simulate` section, its defaults the schema's."""
    return with_defaults("simulate", params.get("simulate"))


def _model_path(params: dict[str, Any], repo: str | Path) -> Path:
    return repo_path(repo, params["model"])


def _allreduce_us(path: str | None) -> tuple[float | None, str, str]:
    """allreduce_us_at_model_size from allreduce.json: (value, source, why-not)."""
    data, why = read_stage_json(path)
    if data is None:
        return None, "", why
    fig = data.get("allreduce_us_at_model_size")
    v = figure_value(fig)
    if v is None:
        reason = fig.get("why") if isinstance(fig, dict) else "field allreduce_us_at_model_size missing"
        return None, "", f"allreduce.json: {reason}"
    return v, "microbench/allreduce.json allreduce_us_at_model_size", ""


def kernel_stage(params: dict[str, Any], allreduce_json: str | None, out: str, repo: str | Path = ".") -> dict:
    from .kernel import KernelSettings, simulate_kernel

    if not params.get("enabled", True):
        result = skipped_stage("simulate_kernel", "disabled by config stages.simulate: false")
        write_json(out, result)
        return result
    sc = sim_config(params)
    spec = load_model_card(_model_path(params, repo))
    ar_us, ar_src, ar_why = _allreduce_us(allreduce_json)
    settings = KernelSettings(
        tp=int(params.get("tp", 1)), ep=int(params.get("ep", 1)), batch=int(params.get("batch_size", 1)),
        context_len=int(params.get("context_len", 512)), weight_format=params.get("weight_format", "bf16"),
        kv_cache_dtype=params.get("kv_cache_dtype", "auto"), layers=sc["layers"], sampling=sc["sampling"],
        warmup=int(sc["warmup"]), iters=int(sc["iters"]), memory_fraction=float(sc["memory_fraction"]),
        allreduce_us=ar_us, allreduce_source=ar_src, allreduce_why=ar_why,
    )
    try:
        result = simulate_kernel(spec, settings)
    except ConfigError:
        raise
    except DecodeGapError as exc:
        if "fits" not in str(exc):
            raise
        result = skipped_stage("simulate_kernel", str(exc), skipped=[{"case": "kernel level", "reason": str(exc)}])
    except Exception as exc:  # out of device memory is a case this host cannot run, not a crash
        if "OutOfMemory" not in type(exc).__name__ and "out of memory" not in str(exc):
            raise
        why = f"out of memory with {settings.layers} layers: {describe(exc, with_type=False)}"
        result = skipped_stage("simulate_kernel", why, skipped=[{"case": "kernel level", "reason": why}])
    result["hardware_revision"] = params.get("hardware_revision")
    write_json(out, result)
    return result


def engine_stage(params: dict[str, Any], gguf: str | None, out: str, repo: str | Path = ".") -> dict:
    from .engine import EngineSettings, resolve_engine, simulate_engine

    if not params.get("enabled", True):
        result = skipped_stage("simulate_engine", "disabled by config stages.simulate: false", engine="none")
        write_json(out, result)
        return result
    sc = sim_config(params)
    live = params.get("live") or {}
    cfg = {"simulate": sc, "endpoint": params.get("endpoint", ""), "live": live,
           "weight_format": params.get("weight_format", "")}
    engine, why = resolve_engine(cfg)
    gguf_path = gguf or params.get("gguf_path") or ""
    if gguf_path:
        gguf_path = str(repo_path(repo, gguf_path))
    prompt = LiveSettings.from_params(params)  # the live stage's prompt shape, parsed once in the core
    s = EngineSettings(
        engine=engine, model_card=str(_model_path(params, repo)), gguf=gguf_path,
        weight_format=params.get("weight_format", "bf16"), input_len=prompt.input_len,
        max_tokens=prompt.max_tokens, repeats=int(sc["engine_repeats"]),
        threads=prompt.threads, compile=bool(sc["engine_compile"]),
        memory_fraction=float(sc["memory_fraction"]),
    )
    result = simulate_engine(s)
    result["engine_source"] = why
    result["hardware_revision"] = params.get("hardware_revision")
    write_json(out, result)
    return result


def server_stage(params: dict[str, Any], out: str) -> dict:
    from .engine import resolve_engine
    from .server import calibrate_transport

    sc = sim_config(params)
    if not params.get("enabled", True) or not sc.get("http_calibration", True):
        why = ("disabled by config stages.simulate: false" if not params.get("enabled", True)
               else "disabled by simulate.http_calibration: false")
        result = skipped_stage("calibrate_server", why)
        write_json(out, result)
        return result
    cfg = {"simulate": sc, "endpoint": params.get("endpoint", ""), "live": params.get("live") or {},
           "weight_format": params.get("weight_format", "")}
    engine, _ = resolve_engine(cfg)
    preferred = "sse-starlette" if engine == "llama.cpp" else "starlette"
    cal = calibrate_transport(preferred)
    from ..host import cpu_model

    result = {"stage": "calibrate_server", "device": f"cpu: {cpu_model()}", "backend": cal.get("stack_description"),
              "engine": engine, **cal, "skipped": [] if cal.get("status") == "ok" else
              [{"case": "HTTP calibration", "reason": cal.get("reason", "")}],
              "python": platform.python_version(),
              "hardware_revision": params.get("hardware_revision")}  # the gap stage never mixes hosts
    write_json(out, result)
    return result


def merge(kernel: str, engine: str, server: str | None, out: str) -> dict:
    parts = {"kernel": read_json(kernel), "engine": read_json(engine)}
    if server:
        parts["server"] = read_json(server)
    statuses = [p.get("status", "ok") for p in parts.values()]
    status = "ok" if all(s == "ok" for s in statuses) else ("skipped" if all(s == "skipped" for s in statuses) else "partial")
    result: dict[str, Any] = {
        "stage": "simulate",
        "status": status,
        "device": parts["kernel"].get("device") or parts["engine"].get("device"),
        "backend": parts["kernel"].get("backend"),
        **parts,
        "skipped": [dict(s, level=name) for name, p in parts.items() for s in (p.get("skipped") or [])],
    }
    if status != "ok":
        result["reason"] = "; ".join(f"{name}: {p.get('reason')}" for name, p in parts.items()
                                     if p.get("status") != "ok" and p.get("reason"))
    write_json(out, result)
    return result
