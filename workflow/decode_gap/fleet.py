"""Fleets: a node type's identity for SLURM runs, and the multi-node all-reduce launch (srun + torchrun rendezvous).

Two jobs on a SLURM cluster need help beyond the Snakemake profile (workflow/profiles/slurm, docs/slurm.md):

* **Which hardware revision is a node type?** The submit host is rarely the node type being measured, so its
  auto-detected `<hw-rev>` is the wrong one. `python -m decode_gap.fleet detect --partition P` runs the same
  detection on one node of that partition (through `srun`) and prints `hardware=<spec> hardware_revision=<slug>`,
  ready for `snakemake --config ...`.
* **All-reduce across nodes.** With `microbench.allreduce.nodes: N > 1`, the bench_allreduce job holds N nodes
  (`allreduce_resources`) and starts one `torchrun` per node with `srun`; the torchruns meet through the c10d
  rendezvous on the first node of the allocation (`multinode_command`). `python -m decode_gap.fleet
  rendezvous-check` runs the same launch with a one-element all-reduce, to check a fleet's network first.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import ConfigError, DecodeGapError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # workflow/: what PYTHONPATH needs for `-m decode_gap...`
REPO = PACKAGE_DIR.parent
RDZV_BASE_PORT = 29400
RDZV_PORT_ENV = "DECODE_GAP_RDZV_PORT"
# Set by salloc/sbatch when the allocation holds GPUs.
SLURM_GPU_ENV = ("SLURM_JOB_GPUS", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE")


# --------------------------------------------------------------------------------------------- all-reduce layout
@dataclass(frozen=True)
class AllreduceLayout:
    """How the all-reduce ranks sit on nodes: `nodes` x `per_node` = `world_size`."""

    nodes: int
    per_node: int
    world_size: int

    @property
    def multinode(self) -> bool:
        return self.nodes > 1


def allreduce_layout(config: Mapping[str, Any]) -> AllreduceLayout:
    """Ranks per node from `microbench.allreduce.{world_size,nodes}` (world_size defaults to tp)."""
    ar = (config.get("microbench") or {}).get("allreduce") or {}
    return layout_of(int(ar.get("world_size") or config.get("tp") or 1), int(ar.get("nodes") or 1))


def layout_of(world: int, nodes: int) -> AllreduceLayout:
    """`world` ranks over `nodes` nodes; ConfigError naming the config field when they do not split evenly."""
    if nodes < 1:
        raise ConfigError(f"config field 'microbench.allreduce.nodes': expected at least 1, got {nodes}")
    if world % nodes:
        raise ConfigError(
            f"config field 'microbench.allreduce.world_size': {world} ranks do not split evenly over "
            f"microbench.allreduce.nodes={nodes}"
        )
    return AllreduceLayout(nodes=nodes, per_node=world // nodes, world_size=world)


def allreduce_resources(config: Mapping[str, Any], gpu_host: bool) -> dict[str, Any]:
    """Snakemake `resources:` for bench_allreduce, as snakemake-executor-plugin-slurm reads them.

    One node: `gpu=<world_size>` (`sbatch --gpus=N`; 0 on a host without GPUs). Several nodes: the job holds
    `nodes` nodes with one task each (`--nodes=N --ntasks=N`) and `gres=gpu:<per node>` on every node;
    `mpi="srun"` tells the plugin's job step to run the rule's script directly on the first node (not inside
    an `srun` step that would hold the allocation), so the script can `srun` torchrun over all nodes.
    `tasks_per_gpu=0` keeps the plugin from adding `--ntasks-per-gpu`.
    """
    layout = allreduce_layout(config)
    if not layout.multinode:
        return {"gpu": layout.world_size if gpu_host else 0}
    res: dict[str, Any] = {"nodes": layout.nodes, "tasks": layout.nodes, "mpi": "srun", "tasks_per_gpu": 0}
    if gpu_host:
        res["gres"] = f"gpu:{layout.per_node}"
    return res


# --------------------------------------------------------------------------------------------- commands
def torchrun_launcher(python: str | None = None) -> list[str]:
    """`torchrun` of the same environment as `python` (the venv's), else `python -m torch.distributed.run`."""
    python = os.path.normpath(python or sys.executable)  # not resolve(): a venv's python is a symlink
    script = Path(python).with_name("torchrun")
    return [str(script)] if script.exists() else [python, "-m", "torch.distributed.run"]


def torchrun_command(
    *,
    nodes: int,
    nproc_per_node: int,
    endpoint: str,
    rdzv_id: str,
    module: str,
    module_args: Sequence[str] = (),
    launcher: Sequence[str] | None = None,
) -> list[str]:
    """`torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint host:port -m module args`."""
    return [
        *(launcher or torchrun_launcher()),
        "--nnodes", str(nodes),
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", rdzv_id,
        "--max-restarts", "0",
        "-m", module, *module_args,
    ]  # fmt: skip


def srun_command(*, nodes: int, gpus_per_node: int = 0, extra: Sequence[str] = ()) -> list[str]:
    """`srun` that starts one launcher per node of the current allocation; one failure ends them all."""
    cmd = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if gpus_per_node:
        cmd.append(f"--gres=gpu:{gpus_per_node}")
    return [*cmd, *extra]


def job_hostnames(env: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's hosts, in SLURM's order (`scontrol show hostnames $SLURM_JOB_NODELIST`)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise DecodeGapError(
            "microbench.allreduce.nodes > 1 needs a SLURM allocation (SLURM_JOB_NODELIST is not set): "
            "run with --profile workflow/profiles/slurm (docs/slurm.md)"
        )
    if not shutil.which("scontrol"):
        raise DecodeGapError("scontrol not found: the multi-node all-reduce needs SLURM's client commands on the node")
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False
    )
    hosts = out.stdout.split()
    if out.returncode or not hosts:
        raise DecodeGapError(
            f"scontrol show hostnames {nodelist}: {(out.stderr or 'no hosts').strip().splitlines()[0]}"
        )
    return hosts


def rendezvous_port(job_id: str, env: Mapping[str, str] | None = None) -> int:
    """The c10d port: $DECODE_GAP_RDZV_PORT, else 29400 + (job id mod 1000), so two jobs on a head node differ."""
    env = os.environ if env is None else env
    if env.get(RDZV_PORT_ENV):
        try:
            port = int(env[RDZV_PORT_ENV])
        except ValueError:
            port = 0
        if not 1024 <= port <= 65535:
            raise DecodeGapError(
                f"environment variable {RDZV_PORT_ENV}: expected a port 1024-65535, got {env[RDZV_PORT_ENV]!r}"
            )
        return port
    digits = "".join(c for c in str(job_id) if c.isdigit()) or "0"
    return RDZV_BASE_PORT + int(digits) % 1000


def multinode_command(
    layout: AllreduceLayout,
    *,
    module: str,
    module_args: Sequence[str] = (),
    gpus: bool,
    env: Mapping[str, str] | None = None,
    hosts: Sequence[str] | None = None,
    launcher: Sequence[str] | None = None,
    srun_extra: Sequence[str] = (),
) -> list[str]:
    """srun + torchrun for `layout` inside the current SLURM allocation, rendezvous on its first host."""
    env = os.environ if env is None else env
    hosts = list(hosts) if hosts is not None else job_hostnames(env)
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise DecodeGapError("SLURM_JOB_ID is not set: the multi-node all-reduce runs inside a SLURM job")
    if len(hosts) < layout.nodes:
        raise DecodeGapError(
            f"config field 'microbench.allreduce.nodes': {layout.nodes} nodes wanted, the SLURM job "
            f"{job_id} holds {len(hosts)} ({','.join(hosts)})"
        )
    endpoint = f"{hosts[0]}:{rendezvous_port(job_id, env)}"
    return [
        *srun_command(nodes=layout.nodes, gpus_per_node=layout.per_node if gpus else 0, extra=srun_extra),
        *torchrun_command(
            nodes=layout.nodes,
            nproc_per_node=layout.per_node,
            endpoint=endpoint,
            rdzv_id=f"decode-gap-{job_id}",
            module=module,
            module_args=module_args,
            launcher=launcher,
        ),
    ]


def launch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment with the package importable on every node (shared filesystem)."""
    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PACKAGE_DIR) not in parts:
        parts.insert(0, str(PACKAGE_DIR))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_launch(
    cmd: Sequence[str],
    *,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    grace_s: float = 45.0,
) -> None:
    """Run a launch command, output to our stdout/stderr (the rule's log); a failure is one DecodeGapError line.

    The launch runs in its own session. Past `timeout_s` (or when we are interrupted) it gets SIGTERM, which
    srun forwards to its tasks and torchrun turns into stopping its workers (torchrun waits up to 30 s for
    them); whatever is left of its process group after `grace_s` is killed. No launch outlives the call.
    """
    print("launch:", shlex.join(cmd), flush=True)
    try:
        proc = subprocess.Popen(list(cmd), env=launch_env(env), start_new_session=True)
    except FileNotFoundError:
        raise DecodeGapError(f"{cmd[0]} not found: the launch needs it on PATH") from None
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_launch(proc, grace_s)
        raise DecodeGapError(f"{cmd[0]} did not finish within {timeout_s:.0f} s: {shlex.join(cmd)}") from None
    except BaseException:
        stop_launch(proc, grace_s)
        raise
    if code:
        raise DecodeGapError(f"{cmd[0]} exited with status {code}: {shlex.join(cmd)}")


def stop_launch(proc: subprocess.Popen, grace_s: float = 45.0) -> None:
    """SIGTERM the launch's process group, then SIGKILL it after `grace_s` (the group of a start_new_session child)."""
    def group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    if proc.poll() is None:
        group(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    members = _group_members(proc.pid)
    group(signal.SIGKILL)  # stragglers of the group (the leader may be gone already)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    # SIGKILL is delivered asynchronously: a member can still be running for a moment after killpg returns
    _wait_dead(members, timeout_s=10.0)


def _group_members(pgid: int) -> list:
    """The live processes of process group `pgid` (psutil; the group's leader may have exited already)."""
    import psutil

    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _wait_dead(members: list, timeout_s: float) -> None:
    """Until every member has exited (a zombie not yet reaped by its parent counts as exited) or `timeout_s`."""
    import psutil

    def alive(p) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in members) and time.monotonic() < deadline:
        time.sleep(0.02)


# --------------------------------------------------------------------------------------------- node identity
def node_identity(repo: str | Path = REPO) -> dict[str, Any]:
    """What this node is, by the same detection the Snakefile does: the hardware spec and `<hw-rev>`."""
    from .fingerprint import measure_components
    from .hardware import resolve_hardware
    from .host import hardware_revision, host_identity

    ident = host_identity()
    spec = resolve_hardware("auto", Path(repo) / "config" / "hardware", ident)
    return {
        "host": socket.gethostname(),
        "gpus": list(ident.gpu_names),
        "cpu": ident.cpu_model,
        "driver": ident.driver,
        "hardware": spec.key,
        "hardware_name": spec.name,
        "hardware_revision": hardware_revision(ident),
        # what the cluster DAG's rerun triggers compare against (the submit host cannot measure it)
        "fingerprint": measure_components(),
    }


def detect_command(
    *,
    partition: str = "",
    constraint: str = "",
    account: str = "",
    exclusive: bool = True,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """`srun` of `python -m decode_gap.fleet identify` on one node of a node type.

    `--exclusive` gives the probe the whole node, so GPU detection sees every GPU even where cgroups hide the
    ones a job was not given.
    """
    cmd = ["srun", "--nodes=1", "--ntasks=1"]
    if exclusive:
        cmd.append("--exclusive")
    for flag, value in (("--partition", partition), ("--constraint", constraint), ("--account", account)):
        if value:
            cmd.append(f"{flag}={value}")
    return [*cmd, *extra, python or sys.executable, "-m", "decode_gap.fleet", "identify"]


def parse_identity(stdout: str, where: str = "decode_gap.fleet identify") -> dict[str, Any]:
    """The last JSON object line of the probe's output (srun may prefix warnings)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and "hardware_revision" in data:
                return data
    raise DecodeGapError(f"{where}: no identity in its output: {stdout.strip()[:200]!r}")


def config_args(identity: Mapping[str, Any]) -> str:
    """`hardware=<spec> hardware_revision=<slug>` for `snakemake --config`; an unknown GPU is an error."""
    if identity.get("hardware") == "unknown-gpu":
        gpu = (identity.get("gpus") or ["?"])[0]
        raise DecodeGapError(
            f"node {identity.get('host')}: GPU '{gpu}' matches no spec in config/hardware/ "
            "(add one with a `match:` entry; rates may be `measure`)"
        )
    return f"hardware={identity['hardware']} hardware_revision={identity['hardware_revision']}"


def detect(timeout_s: float = 600, **kwargs: Any) -> dict[str, Any]:
    cmd = detect_command(**kwargs)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise DecodeGapError("srun not found: `detect` runs on a SLURM submit host") from None
    except subprocess.TimeoutExpired:
        raise DecodeGapError(f"{shlex.join(cmd)}: no node within {timeout_s:.0f} s") from None
    if out.returncode:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise DecodeGapError(f"{shlex.join(cmd)}: exit status {out.returncode}: {tail}")
    return parse_identity(out.stdout, shlex.join(cmd))


# --------------------------------------------------------------------------------------------- rendezvous check
def rendezvous_check_worker() -> dict[str, Any]:
    """One rank under torchrun: join the group, all-reduce a one, gather host names. Returns rank 0's summary."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, init_method="env://")
    try:
        world = dist.get_world_size()
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        ok = int(value.item()) == world
        summary = {
            "rank": dist.get_rank(),
            "world_size": world,
            "backend": backend,
            "allreduce_sum": float(value.item()),
            "ok": ok,
            "hosts": sorted(set(hosts)),
        }
    finally:
        dist.destroy_process_group()
    if not ok:
        raise DecodeGapError(f"all-reduce of ones over {world} ranks gave {value.item()}")
    return summary


# --------------------------------------------------------------------------------------------- CLI
def _cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decode_gap.fleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("identify", help="print this node's identity as one JSON line")
    det = sub.add_parser("detect", help="identify one node of a node type through srun; print --config values")
    det.add_argument("-p", "--partition", default="")
    det.add_argument("-C", "--constraint", default="")
    det.add_argument("-A", "--account", default="")
    det.add_argument("--no-exclusive", action="store_true", help="share the node (GPUs hidden by cgroups are missed)")
    det.add_argument("--json", action="store_true", help="print the whole identity as JSON")
    det.add_argument(
        "--results",
        default="results",
        help="where to record the node's fingerprint: <results>/<hw-rev>/node_fingerprint.json "
        "(default: results/ of the checkout you run in)",
    )
    sub.add_parser("rendezvous-worker", help="(internal) one torchrun rank of rendezvous-check")
    chk = sub.add_parser(
        "rendezvous-check",
        help="inside a SLURM allocation: srun+torchrun a one-element all-reduce over its nodes",
    )
    chk.add_argument("--nodes", type=int, default=0, help="nodes to use (default: all of the allocation)")
    chk.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (GPUs per node)")
    chk.add_argument(
        "--gpus",
        action="store_true",
        help="ask srun for --gres=gpu:<nproc-per-node> (default: when the allocation has GPUs)",
    )
    chk.add_argument("--dry-run", action="store_true", help="print the launch command only")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "identify":
            print(json.dumps(node_identity()), flush=True)
        elif args.cmd == "detect":
            ident = detect(
                partition=args.partition,
                constraint=args.constraint,
                account=args.account,
                exclusive=not args.no_exclusive,
            )
            line = json.dumps(ident) if args.json else config_args(ident)
            if ident.get("fingerprint"):
                from .fingerprint import record_node

                where = record_node(args.results, ident)
                print(f"decode-gap: recorded node {ident.get('host')}'s fingerprint in {where}", file=sys.stderr)
            print(line)
        elif args.cmd == "rendezvous-worker":
            summary = rendezvous_check_worker()
            if summary["rank"] == 0:
                print(json.dumps(summary), flush=True)
        elif args.cmd == "rendezvous-check":
            hosts = job_hostnames()
            nodes = args.nodes or len(hosts)
            layout = AllreduceLayout(nodes=nodes, per_node=args.nproc_per_node, world_size=nodes * args.nproc_per_node)
            gpus = args.gpus or any(os.environ.get(k) for k in SLURM_GPU_ENV)
            cmd = multinode_command(
                layout, module="decode_gap.fleet", module_args=["rendezvous-worker"], gpus=gpus, hosts=hosts
            )
            if args.dry_run:
                print(shlex.join(cmd))
            else:
                run_launch(cmd)
    except DecodeGapError as exc:
        print(f"decode-gap: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
