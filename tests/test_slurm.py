"""The pipeline's CPU path through `snakemake --executor slurm` on a real single-node SLURM cluster.

tests/slurm/start.sh starts munged, slurmctld and slurmd (Debian's slurm-wlm) on 127.0.0.1 as root; the test
runs the same tiny pipeline twice in temporary copies of the repo, once locally and once through the SLURM
profile (workflow/profiles/slurm), checks that the two produce the same report files, that the cluster stages
ran as SLURM jobs and the report stages on the submit host; tests/slurm/stop.sh stops the daemons afterwards.
Skipped, with the reason, where slurm-wlm, munge, the executor plugin or root are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
START, STOP = HERE / "slurm" / "start.sh", HERE / "slurm" / "stop.sh"
MARKER = "# decode-gap single-node test cluster"
SLURM_CONF = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))

FINISHED = re.compile(r"^Finished jobid: \d+ \(Rule: (\w+)\)", flags=re.M)

# Small enough for a 2-core CI host. The live stage and the engine-level simulation are off (they would load
# the embedded model on each side, minutes on this host); their rules still run and write skipped summaries.
# Keys the schema does not (yet) know are dropped, so the test follows the stages as they grow.
TINY = {
    "stages": {"live": False},
    "microbench": {
        "m_values": [1, 2],
        "cpu_m_values": [1],
        "warmup": 1,
        "iters": 3,
        "cpu_case_budget_s": 0.05,
        "allreduce": {"min_bytes": 8, "max_bytes": 4096, "cpu_max_bytes": 4096, "nccl_tests": False},
        "attention": {"context_lens": [64]},
    },
    "simulate": {"layers": 1, "engine": "none"},
}


def _known_to_schema(overrides: dict, schema: dict) -> dict:
    props = schema.get("properties", {})
    out = {}
    for key, value in overrides.items():
        if key not in props:
            continue
        if isinstance(value, dict) and props[key].get("type") == "object":
            value = _known_to_schema(value, props[key])
        out[key] = value
    return out


def tiny_config() -> str:
    schema = json.loads((REPO / "workflow" / "schemas" / "config.schema.json").read_text())
    return json.dumps(_known_to_schema(TINY, schema))  # JSON is YAML


def _why_skip() -> str | None:
    missing = [
        b for b in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "srun", "scontrol") if not shutil.which(b)
    ]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install -y slurm-wlm munge"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm not installed: pip install -e '.[slurm]'"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs; run this test as root (CI does)"
    if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text(errors="replace"):
        return f"{SLURM_CONF} belongs to a real SLURM installation; the test will not replace it"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    why = _why_skip()
    if why:
        pytest.skip(why)
    state = tmp_path_factory.mktemp("slurm-state")
    env = dict(os.environ, DECODE_GAP_SLURM_STATE=str(state), DECODE_GAP_SLURM_PORTS=" ".join(map(str, _free_ports(2))))
    try:
        started = subprocess.run(["bash", str(START)], env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, f"tests/slurm/start.sh failed:\n{started.stdout}\n{started.stderr}"
        yield env
    finally:
        stopped = subprocess.run(["bash", str(STOP)], env=env, capture_output=True, text=True, timeout=180)
        assert stopped.returncode == 0, stopped.stderr
        for name in ("munged", "slurmctld", "slurmd"):
            assert not (state / "run" / f"{name}.pid").exists(), f"{name} still has a pid file after stop.sh"
        assert not (SLURM_CONF.exists() and MARKER in SLURM_CONF.read_text(errors="replace"))


def _copy_repo(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(
        ".venv", ".git", "results", ".snakemake", "__pycache__", ".pytest_cache", "resources", "*.egg-info"
    )
    shutil.copytree(REPO, dest, ignore=ignore)
    archive = dest / "report" / "archive"
    if archive.exists():
        for entry in archive.iterdir():
            if entry.name != "README.md":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    # The embedded GGUF (250 MB, assembled once by assemble_gguf): link it rather than copy it.
    for src in (REPO / "resources" / "models").glob("*.gguf"):
        (dest / "resources" / "models").mkdir(parents=True, exist_ok=True)
        (dest / "resources" / "models" / src.name).symlink_to(src)
    (dest / "tiny.yaml").write_text(tiny_config())
    return dest


class Run(NamedTuple):
    proc: subprocess.Popen
    cmd: str
    workdir: Path


def _snakemake(workdir: Path, args: list[str], env: dict[str, str]) -> Run:
    """Start `snakemake report` on the tiny config in `workdir`; its output goes to workdir/run.log."""
    env = dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "snakemake", "report", "--configfile", "config/config.yaml", "tiny.yaml", *args]
    with open(workdir / "run.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Run(proc, " ".join(cmd), workdir)


def _finish(run: Run, timeout: int = 2400) -> str:
    try:
        run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.proc.terminate()  # snakemake cancels its SLURM jobs on SIGTERM
        run.proc.wait(timeout=120)
    log = (run.workdir / "run.log").read_text(errors="replace")
    assert run.proc.returncode == 0, f"{run.cmd} failed in {run.workdir}:\n{log[-6000:]}"
    return log


def _report_files(workdir: Path, rev: str) -> dict[str, str | None]:
    """Every file under results/<rev>/ and report/archive/<rev>/ (run ids collapsed), with each stage JSON's
    `stage:status` and the first bytes of the HTML and PDF."""
    out: dict[str, str | None] = {}
    for path in sorted((workdir / "results" / rev).rglob("*")):
        if path.is_file():
            rel = str(path.relative_to(workdir / "results" / rev))
            status = None
            if path.suffix in (".pdf", ".html"):  # a real document on both sides, or a stub on both
                status = path.read_bytes()[:5].decode("latin-1")
            elif path.suffix == ".json" and path.stat().st_size:  # an empty declared log (stubbed rules) is no stage file
                data = json.loads(path.read_text())
                status = f"{data.get('stage')}:{data.get('status')}" if isinstance(data, dict) else None
            out[f"results/{rel}"] = status
    archive = workdir / "report" / "archive" / rev
    for path in sorted(archive.rglob("*")) if archive.exists() else []:
        if path.is_file():
            parts = path.relative_to(archive).parts
            out["archive/" + "/".join(parts[1:] if len(parts) > 1 else parts)] = None
    return out


def test_pipeline_cpu_path_through_slurm_executor(slurm_cluster, tmp_path):
    env = slurm_cluster
    local = _copy_repo(tmp_path / "local")
    cluster = _copy_repo(tmp_path / "cluster")

    # The node type's hardware revision, detected on a node through srun (the fleet way), pinned for both runs.
    detect = subprocess.run(
        [sys.executable, "-m", "decode_gap.fleet", "detect", "--json"],
        cwd=cluster,
        env=dict(env, PYTHONPATH=str(cluster / "workflow")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert detect.returncode == 0, detect.stderr
    ident = json.loads(detect.stdout)
    rev = ident["hardware_revision"]
    pin = ["--config", f"hardware={ident['hardware']}", f"hardware_revision={rev}"]

    # Both at once: the SLURM run mostly waits on the queue.
    local_run = _snakemake(local, ["--cores", "1", *pin], env)
    cluster_run = _snakemake(
        cluster,
        # --cores: rule measure_live asks for `threads: workflow.cores`, which needs it even under a cluster executor.
        [
            "--profile",
            "workflow/profiles/slurm",
            "--jobs",
            "2",
            "--cores",
            "2",
            "--max-threads",
            "2",
            # No slurmdbd here, so no sacct: poll squeue (the test cluster keeps finished jobs for an hour).
            "--slurm-status-command",
            "squeue",
            "--slurm-init-seconds-before-status-checks",
            "2",
            "--slurm-keep-successful-logs",
            "--latency-wait",
            "10",
            *pin,
        ],
        dict(env, DECODE_GAP_SLURM_PARTITION="debug"),
    )
    try:
        local_log = _finish(local_run)
    finally:
        cluster_log = _finish(cluster_run)

    # The cluster DAG compared its rerun triggers against the node's fingerprint, recorded by detect.
    assert "fingerprint taken on the submit host" not in cluster_log
    # The same report files, with the same stage statuses (detect's node record aside).
    expected, got = _report_files(local, rev), _report_files(cluster, rev)
    assert "results/node_fingerprint.json" in got
    del got["results/node_fingerprint.json"]
    assert "results/report.html" in expected and "results/report.pdf" in expected
    assert got == expected

    # Every rule that ran, ran as a SLURM job unless it is a localrule; localrules ran on the submit host.
    ran = set(FINISHED.findall(local_log)) - {"report"}
    assert set(FINISHED.findall(cluster_log)) - {"report"} == ran
    local_rules = {r for r in ran if re.search(rf"^rule {r}:\n(?:    .*\n|\n)*?    localrule: True", _smk_text(), re.M)}
    assert {"render_report", "archive_report"} <= local_rules
    slurm_logs = cluster / ".snakemake" / "slurm_logs"
    in_slurm = {p.name.removeprefix("rule_") for p in slurm_logs.iterdir() if p.is_dir()}
    assert ran - local_rules <= in_slurm, f"not submitted to SLURM: {sorted(ran - local_rules - in_slurm)}"
    assert not (local_rules & in_slurm), f"localrules submitted to SLURM: {sorted(local_rules & in_slurm)}"
    jobs = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%k|%T"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    completed = {line.split("|")[0].removeprefix("rule_") for line in jobs if line.endswith("|COMPLETED")}
    assert ran - local_rules <= completed


def _smk_text() -> str:
    return "\n".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk")))


def _isolated_net() -> list[str] | None:
    """`unshare --net` with loopback up: torchrun's stores then listen in a namespace that has only loopback."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return None
    ok = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if ok.returncode == 0 else None


LAUNCH = """\
import sys
from decode_gap import fleet

layout = fleet.AllreduceLayout(nodes=1, per_node=2, world_size=2)
wrap = sys.argv[1:]  # the test's network namespace, between srun and torchrun
cmd = fleet.multinode_command(layout, module="decode_gap.fleet", module_args=["rendezvous-worker"], gpus=False,
                              launcher=[*wrap, *fleet.torchrun_launcher()])
fleet.run_launch(cmd, timeout_s=300)
"""


def test_multinode_launch_inside_a_slurm_allocation(slurm_cluster, tmp_path):
    """The all-reduce launch as bench_allreduce runs it on a fleet, on this one-node cluster: salloc holds the
    allocation, multinode_command's srun starts torchrun on its node, the ranks meet through the c10d rendezvous
    on the allocation's first host and all-reduce over gloo."""
    wrap = _isolated_net()
    if wrap is None:
        pytest.skip(
            "no private network namespace here (unshare --net): torchrun's stores would listen on every address"
        )
    script = tmp_path / "launch.py"
    script.write_text(LAUNCH)
    env = dict(slurm_cluster, PYTHONPATH=str(REPO / "workflow"), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    done = subprocess.run(
        ["salloc", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", sys.executable, str(script), *wrap],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    launch = next(line for line in done.stdout.splitlines() if line.startswith("launch: "))
    assert launch.startswith("launch: srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 unshare")
    assert f"--rdzv-endpoint {socket.gethostname().split('.')[0]}:" in launch and "--nproc-per-node 2" in launch
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert (summary["world_size"], summary["backend"], summary["ok"]) == (2, "gloo", True)
