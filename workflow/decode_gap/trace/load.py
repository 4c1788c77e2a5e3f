"""Read torch.profiler Chrome traces (.json or .json.gz, one file or a directory of per-rank files) into frames.

torch.profiler (Kineto) writes `{"traceEvents": [...], "distributedInfo": {...}, ...}`; complete events have
`ph: "X"`, `ts`/`dur` in microseconds. GPU work is `cat` kernel / gpu_memcpy / gpu_memset (older Kineto: Kernel,
Memcpy, Memset) on `pid` = device; launches are cuda_runtime / cuda_driver events; both carry
`args.correlation`, which links a kernel to the CPU call that launched it (a CUDA graph's kernels all carry the
correlation of their cudaGraphLaunch).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DecodeGapError, describe

try:  # orjson parses a 100 MB trace several times faster than the stdlib; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
TRACE_SUFFIXES = (".json", ".json.gz")
RANK_RES = (re.compile(r"-TP-(\d+)"), re.compile(r"rank[_-]?(\d+)", re.I), re.compile(r"[_-]tp(\d+)", re.I))


@dataclass
class Trace:
    """The complete (`ph: X`) events of one trace file, as columns."""

    path: str
    rank: int | None
    events: pd.DataFrame  # cat, name, pid, tid, ts, dur, end, corr, ext
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu(self) -> pd.DataFrame:
        return self.events[self.events["cat"].isin(GPU_CATS)]

    @property
    def runtime(self) -> pd.DataFrame:
        return self.events[self.events["cat"].isin(RUNTIME_CATS)]


def trace_files(path: str | Path) -> list[Path]:
    """The trace files at `path`: the file itself, or the .json/.json.gz files of a directory (one per rank)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise DecodeGapError(f"trace directory {p}: holds no .json or .json.gz trace file")
        return files
    raise DecodeGapError(f"config key 'trace': {p} does not exist")


def input_files(path: str) -> list[str]:
    """The rule's input: the trace files at `path` (a new trace reruns the stage); none when unset or missing,
    so the stage runs and says why."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return []
    if p.is_file():
        return [str(p)]
    return sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))


def _decode(path: Path) -> Any:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DecodeGapError(f"trace {path}: truncated or corrupt gzip ({exc})") from None
    if not raw.strip():
        raise DecodeGapError(f"trace {path}: the file is empty")
    try:
        return _orjson.loads(raw) if _orjson is not None else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeGapError(f"trace {path}: not valid JSON ({describe(exc, with_type=False)}); a truncated or foreign "
                             "file?") from None


def _rank_of(path: Path, meta: dict[str, Any]) -> int | None:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    for rx in RANK_RES:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return None


def _num(values: list[Any]) -> np.ndarray:
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)


def read_trace(path: str | Path) -> Trace:
    """Parse one trace file; a foreign or truncated file is one DecodeGapError line naming it."""
    path = Path(path)
    data = _decode(path)
    if isinstance(data, list):
        events, meta = data, {}
    elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        events, meta = data["traceEvents"], {k: v for k, v in data.items() if k != "traceEvents"}
        if meta.get("decode_gap_skipped"):  # record_engine_trace could not run here: say why, not "empty"
            raise DecodeGapError(str(meta["decode_gap_skipped"]))
    else:
        raise DecodeGapError(f"trace {path}: not a Chrome trace (no 'traceEvents' list); torch.profiler's "
                             "export_chrome_trace writes one")
    # Columns by comprehension: ~10x faster than DataFrame(list of dicts) on a few million events.
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    if not xs and events and not any(isinstance(e, dict) and "ph" in e for e in events[:1000]):
        raise DecodeGapError(f"trace {path}: not a Chrome trace (its events have no 'ph' field)")
    args = [e.get("args") if isinstance(e.get("args"), dict) else {} for e in xs]
    df = pd.DataFrame({
        "cat": pd.Series([str(e.get("cat", "")).lower() for e in xs], dtype=object),
        "name": pd.Series([str(e.get("name", "")) for e in xs], dtype=object),
        "pid": pd.Series([str(e.get("pid", "")) for e in xs], dtype=object),
        "tid": pd.Series([str(e.get("tid", "")) for e in xs], dtype=object),
        "ts": _num([e.get("ts") for e in xs]),
        "dur": _num([e.get("dur", 0) for e in xs]),
        "corr": _num([a.get("correlation") for a in args]),
        "ext": _num([a.get("External id") for a in args]),
    })
    df["dur"] = df["dur"].fillna(0.0).clip(lower=0.0)
    df = df[np.isfinite(df["ts"].to_numpy())].reset_index(drop=True)
    df["end"] = df["ts"] + df["dur"]
    # dtypes of cpu ops (recorded with record_shapes): let a GEMM kernel inherit its op's input dtype
    types = {}
    for e, a in zip(xs, args):
        t = a.get("Input type")
        if t and e.get("cat") == "cpu_op" and a.get("External id") is not None:
            types[a["External id"]] = " ".join(str(x) for x in t if x)
    meta["_input_types"] = types
    return Trace(str(path), _rank_of(path, meta), df, meta)


def read_traces(path: str | Path) -> list[Trace]:
    traces = [read_trace(f) for f in trace_files(path)]
    ranks = [t.rank for t in traces]
    if len(traces) > 1 and (None in ranks or len(set(ranks)) != len(ranks)):
        for i, t in enumerate(traces):  # file order when the names do not say the rank
            t.rank = i
    return traces
