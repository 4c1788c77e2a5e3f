"""All-reduce, the parent: start the ranks on one node (decode_gap.ranks) or across nodes (srun + torchrun
through decode_gap.fleet), and turn a failure into one line naming the rank, its host and its error."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import DecodeGapError
from ..ranks import launch
from .allreduce_rank import ENV_INIT, MODULE

# --------------------------------------------------------------------------- the parent


def launch_ranks(job: dict[str, Any], world_size: int, timeout_s: float) -> list[list[dict[str, Any]]]:
    """One process per rank through the shared launcher (`decode_gap.ranks`); each rank's results, by rank."""
    per_rank = launch(MODULE, job, world_size, timeout_s, "all-reduce")
    missing = [r for r in range(world_size) if r not in per_rank]
    if missing:
        raise DecodeGapError(f"all-reduce: rank {missing[0]} of {world_size} exited without writing its results")
    return [per_rank[r] for r in range(world_size)]


def launch_multinode(
    job: dict[str, Any],
    layout: Any,
    work_dir: str | Path,
    timeout_s: float,
    *,
    gpus: bool,
    env: dict[str, str] | None = None,
    hosts: list[str] | None = None,
    launcher: list[str] | None = None,
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """All ranks of `layout` (a fleet.AllreduceLayout) through srun + torchrun; each rank's results and where it ran.

    `work_dir` must be on the filesystem every node sees (the rule's output directory); it is emptied first,
    so no rank file of an earlier run counts. `env`, `hosts` and `launcher` go to `fleet.multinode_command`
    (the SLURM job's own by default). A failure or a launch past `timeout_s` is one DecodeGapError line naming
    the failed rank, its host and its error; `fleet.run_launch` stops the launch first.
    """
    from .. import fleet

    work = Path(work_dir).resolve()
    job_path = work / "job.json"
    cmd = fleet.multinode_command(layout, module=MODULE, module_args=[str(job_path)], gpus=gpus, env=env,
                                  hosts=hosts, launcher=launcher)  # first: outside a SLURM job, nothing is written
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    job = {**job, "out_dir": str(work), "init_method": ENV_INIT, "world_size": layout.world_size,
           "nodes": layout.nodes}
    job_path.write_text(json.dumps(job))
    try:
        fleet.run_launch(cmd, timeout_s=timeout_s, env=env)
    except DecodeGapError as exc:
        raise DecodeGapError(_multinode_failure(work, layout, _short_launch_error(str(exc)))) from None
    out, missing = [], []
    for r in range(layout.world_size):
        path = work / f"rank{r}.json"
        if path.exists():
            out.append(json.loads(path.read_text()))
        else:
            missing.append(r)
    if missing:
        raise DecodeGapError(_multinode_failure(work, layout, "the launch exited 0"))
    return out, _read_where(work, layout.world_size)


def _read_where(work: Path, world: int) -> list[dict[str, Any]]:
    where = []
    for r in range(world):
        try:
            where.append(json.loads(Path(work, f"rank{r}.where.json").read_text()))
        except (OSError, ValueError):
            where.append({"rank": r, "host": "?"})
    return where


def _short_launch_error(text: str) -> str:
    """fleet.run_launch's message without the whole command line (the log has it)."""
    m = re.match(r"^(.*?(?:exited with status -?\d+|did not finish within \d+ s|not found))", text)
    return m.group(1) if m else text.splitlines()[0][:300]


def _multinode_failure(work: Path, layout: Any, launch_error: str) -> str:
    """One line: the first rank that reported an error (rank, host, error), else the ranks without results."""
    world = layout.world_size
    where = {w["rank"]: w.get("host", "?") for w in _read_where(work, world)}
    errors = []
    for path in work.glob("rank*.error.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    head = f"all-reduce across {layout.nodes} nodes ({world} ranks)"
    # A hung launch: the ranks killed at the deadline may report the broken connection on the way out; the
    # hang is the cause, so the ranks without results come first and those errors follow.
    if errors and "did not finish within" not in launch_error:
        first = min(errors, key=lambda e: e["rank"])
        more = f" (and {len(errors) - 1} other rank(s))" if len(errors) > 1 else ""
        return (f"{head}: rank {first['rank']} on node {first.get('host', '?')} failed: {first['error']}{more}; "
                f"{launch_error}; the other ranks were stopped")
    missing = [r for r in range(world) if not Path(work, f"rank{r}.json").exists()]
    named = ", ".join(f"{r} ({where.get(r, '?')})" for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
    first = ""
    if errors:
        e = min(errors, key=lambda e: e["rank"])
        first = f"; rank {e['rank']} on node {e.get('host', '?')} then reported: {e['error']}"
    return (f"{head}: {launch_error}; rank(s) without results: {named or 'none'} (rank logs: the rule's log)"
            f"{first}")
