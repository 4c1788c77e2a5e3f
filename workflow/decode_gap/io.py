"""File helpers shared by every stage: atomic writes, so a killed run never leaves a half-written result."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def _clean(obj: Any) -> Any:
    # JSON has no NaN/inf; write null so every reader (browsers too) can parse the file.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def _umask_mode() -> int:
    # mkstemp creates 0600 files; results are meant to be read like any other file (0644 under umask 022).
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def read_stage_json(path: str | os.PathLike | None) -> tuple[dict | None, str]:
    """(data, why-not) for another stage's result file: missing, unreadable, not an object or skipped give
    (None, one-line reason naming the file). Stages read each other's results through this, never each other's code."""
    if not path:
        return None, "not an input of this run"
    p = Path(path)
    if not p.is_file():
        return None, f"{p.name} is missing"
    try:
        data = read_json(p)
    except (OSError, ValueError) as exc:
        return None, f"{p.name} is unreadable ({type(exc).__name__})"
    if not isinstance(data, dict):
        return None, f"{p.name} is not a JSON object"
    if data.get("status") == "skipped":
        return None, f"{p.name}: skipped ({data.get('reason', 'no reason given')})"
    return data, ""


def write_table(path: str | os.PathLike, df: pd.DataFrame) -> None:
    """Write a CSV or Parquet table (by suffix) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
