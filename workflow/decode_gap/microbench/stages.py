"""Entry points of the micro-benchmark rules: read the config, run one benchmark, write its files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..config import repo_path
from ..io import write_json, write_table
from ..model import load_model_card
from ..provenance import skipped_stage
from .common import env_from_settings, m_values_for, microbench_settings, read_copy_gbps

STAGES = ("memory", "allreduce", "gemm", "moe", "attention", "launch")


def _model(config: dict[str, Any], repo: Path):
    return load_model_card(repo_path(repo, config["model"]))


def disabled(config: dict[str, Any]) -> bool:
    return not bool((config.get("stages") or {}).get("microbench", True))


def write_disabled(stage: str, csv: str | None, json_path: str, columns: list[str] | None) -> None:
    if csv:
        write_table(csv, pd.DataFrame([], columns=columns or []))
    write_json(json_path, skipped_stage(f"microbench.{stage}", "disabled: stages.microbench is false", skipped=[]))


def run_stage(stage: str, config: dict[str, Any], csv: str | None, json_path: str, memory_json: str | None = None,
              repo: str | Path = ".", log=print) -> dict[str, Any]:
    """Run one micro-benchmark with the run's config; writes `csv` (if any) and `json_path`; returns the summary."""
    from . import allreduce, attention, gemm, launch, memory, moe, shapes

    repo = Path(repo)
    columns = {"allreduce": allreduce.COLUMNS, "gemm": gemm.COLUMNS, "moe": moe.COLUMNS,
               "attention": attention.COLUMNS, "launch": launch.COLUMNS}.get(stage)
    if disabled(config):
        write_disabled(stage, csv, json_path, columns)
        return {"status": "skipped"}
    settings = microbench_settings(config)
    env = env_from_settings(settings, copy_gbps=read_copy_gbps(memory_json))
    spec = _model(config, repo)
    tp, ep, batch = int(config.get("tp", 1)), int(config.get("ep", 1)), int(config.get("batch_size", 1))
    df = None
    if stage == "memory":
        out = memory.measure_memory(env)
    elif stage == "allreduce":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        df, out = allreduce.run_allreduce_bench(
            shapes.world_size(config), shapes.allreduce_model_bytes(spec, batch), settings["allreduce"],
            env.warmup, env.iters if gpus else min(env.iters, 20), env.device_name, gpus, log=log)
    elif stage == "gemm":
        df, out = gemm.run_gemm_bench(env, shapes.gemm_shapes(spec, tp, ep, batch), m_values_for(settings, env), log=log)
    elif stage == "moe":
        df, out = moe.run_moe_bench(env, shapes.moe_shape(spec, tp, ep), m_values_for(settings, env), log=log)
    elif stage == "attention":
        lens = sorted({int(x) for x in settings["attention"]["context_lens"]} | {int(config.get("context_len", 512))})
        df, out = attention.run_attention_bench(env, shapes.attention_shape(spec, tp), lens, sorted({1, batch}), log=log)
    elif stage == "launch":
        small = min(shapes.gemm_shapes(spec, tp, ep, batch), key=lambda s: s.n * s.k)
        df, out = launch.run_launch_bench(env, gemm_nk=(small.n, small.k), log=log)
    else:
        raise ValueError(f"unknown micro-benchmark {stage!r}")
    out.setdefault("model", spec.name)
    out.setdefault("tp", tp)
    if csv is not None:
        write_table(csv, df if df is not None else pd.DataFrame([], columns=columns or []))
    write_json(json_path, out)
    return out
