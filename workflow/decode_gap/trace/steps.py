"""Find the decode steps in a trace: the engine's own annotations, a user annotation, else the kernel stream's period.

Annotations read from the engines' source:
- vLLM (v1 GPU model runner): `record_function_or_nullcontext("gpu_model_runner: preprocess" | "... forward" |
  "... postprocess" | "... sample" | "... draft" | "... bookkeep")`; one execute_model = one family starting at
  preprocess (or at forward when preprocess is absent).
- SGLang: no step annotation of its own; its profiler records Python stacks by default (`with_stack=True`), so each
  scheduler `run_batch` is a `python_function` event named `.../scheduler.py(<line>): run_batch`
  (model_runner `forward_decode` as the fallback).
- A user or the engine level: `record_function("decode_step")` (name configurable); torch.profiler's own
  `ProfilerStep#<n>` when the loop calls `prof.step()` once per token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import DecodeGapError

CPU_SIDE_EXCLUDE = {"gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "ac2g", "cuda_runtime",
                    "cuda_driver", "runtime", "driver", "memcpy", "memset", "trace"}


@dataclass(frozen=True)
class Marker:
    method: str  # how the steps were found (goes into trace.json)
    family: re.Pattern  # every annotation of one step
    start: re.Pattern  # the annotation that opens a step


def markers(step_annotation: str = "decode_step") -> list[Marker]:
    user = re.compile(rf"^{re.escape(step_annotation)}$") if step_annotation else None
    out = []
    if user is not None:
        out.append(Marker(f"annotation '{step_annotation}'", user, user))
    vllm = re.compile(r"^gpu_model_runner: ")
    out += [
        Marker("vLLM annotations (gpu_model_runner: preprocess … sample)", vllm,
               re.compile(r"^gpu_model_runner: preprocess$")),
        Marker("vLLM annotations (gpu_model_runner: forward … sample)", vllm,
               re.compile(r"^gpu_model_runner: forward$")),
        Marker("SGLang scheduler run_batch (Python stack)", re.compile(r"scheduler\.py\(\d+\): run_batch$"),
               re.compile(r"scheduler\.py\(\d+\): run_batch$")),
        Marker("SGLang model_runner forward_decode (Python stack)",
               re.compile(r"model_runner\.py\(\d+\): forward_decode$"),
               re.compile(r"model_runner\.py\(\d+\): forward_decode$")),
        Marker("torch.profiler ProfilerStep#", re.compile(r"^ProfilerStep#\d+$"), re.compile(r"^ProfilerStep#\d+$")),
    ]
    return out


def _windows(cpu: pd.DataFrame, m: Marker) -> pd.DataFrame | None:
    # match the distinct names once: Python-stack traces repeat a few thousand names over millions of events
    names = pd.unique(cpu["name"])
    fam = cpu[cpu["name"].isin([n for n in names if m.family.search(n)])]
    if fam.empty:
        return None
    starts = fam[fam["name"].isin([n for n in pd.unique(fam["name"]) if m.start.search(n)])]
    if starts.empty:
        return None
    # one thread opens the steps: the one with most openings (a server's worker, not a helper thread)
    tkey = starts["pid"] + "/" + starts["tid"]
    main = tkey.value_counts().idxmax()
    starts = starts[tkey == main].sort_values("ts")
    fam = fam[(fam["pid"] + "/" + fam["tid"]) == main].sort_values("ts")
    s = starts["ts"].to_numpy()
    # nested openings (an annotation inside one of the same name) count once
    keep = np.ones(len(s), bool)
    e_open = starts["end"].to_numpy()
    run_end = -np.inf
    for i in range(len(s)):
        if s[i] < run_end:
            keep[i] = False
        else:
            run_end = e_open[i]
    s, e_open = s[keep], e_open[keep]
    # a step ends at the last family annotation that starts before the next opening
    idx = np.searchsorted(s, fam["ts"].to_numpy(), side="right") - 1
    ends = pd.Series(fam["end"].to_numpy()).groupby(idx).max()
    end = np.maximum(e_open, ends.reindex(range(len(s))).fillna(-np.inf).to_numpy())
    return pd.DataFrame({"cpu_start": s, "cpu_end": end, "thread": main})


def annotated_steps(events: pd.DataFrame, step_annotation: str = "decode_step") -> tuple[pd.DataFrame, str] | None:
    cpu = events[~events["cat"].isin(CPU_SIDE_EXCLUDE)]
    for m in markers(step_annotation):
        w = _windows(cpu, m)
        if w is not None and len(w) >= 1:
            return w, m.method
    return None


def periodic_steps(names: np.ndarray, ts: np.ndarray, min_steps: int = 3) -> tuple[np.ndarray, int]:
    """Kernel indices where steps start, from the period of the name sequence (kernels sorted by start).

    A name that occurs once per step (the lm_head GEMM, the sampling kernel) recurs at a constant index distance:
    that distance is the period. The boundary inside the period is the kernel after the widest typical gap.
    Raises DecodeGapError when no such structure exists.
    """
    n = len(names)
    codes, uniq = pd.factorize(pd.Series(names))
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    groups = np.split(order, bounds)
    best: tuple[int, int] | None = None  # (count, period)
    for g in groups:
        if len(g) < min_steps:
            continue
        d = np.diff(g)[1:-1] if len(g) > 3 else np.diff(g)  # the edges may cut a step short
        period = int(np.median(d))
        # every interior distance equal: a per-layer kernel fails this (its distance jumps at the step edge)
        if period < 2 or not np.all(d == period):
            continue
        cand = (len(g), -period)
        if best is None or cand > (best[0], -best[1]):
            best = (len(g), period)
    if best is None:
        raise DecodeGapError("no recognisable decode steps: no step annotation (decode_step, vLLM "
                             "gpu_model_runner, SGLang run_batch, ProfilerStep#) and no periodic kernel sequence")
    period = best[1]
    reps = n // period
    if reps < min_steps:
        raise DecodeGapError(f"no recognisable decode steps: the kernel sequence repeats only {reps} times")
    gaps = np.empty(n)
    gaps[0] = np.inf
    gaps[1:] = ts[1:] - ts[:-1]
    typical = np.median(gaps[: reps * period].reshape(reps, period)[1:], axis=0) if reps > 1 else gaps[:period]
    offset = int(np.argmax(typical))
    starts = np.arange(offset, n, period)
    return starts, period
