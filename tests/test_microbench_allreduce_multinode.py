"""The all-reduce across nodes: srun + torchrun rendezvous, ranks joining through env://.

The command construction and the failure line are checked with `fleet.run_launch` replaced by a test double
(there is no SLURM job here). The real launches start torchrun (the venv's) and gloo ranks on this host, under
`fake_srun`, a test double for SLURM's srun: it starts `--ntasks` copies of its command here, as srun starts
one per node, inside one private network namespace with only loopback (torchrun's stores listen on every
address). Those tests are skipped where `unshare --net` is not allowed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

from decode_gap import fleet
from decode_gap.errors import DecodeGapError
from decode_gap.io import write_json, write_table
from decode_gap.microbench import allreduce as ar
from decode_gap.microbench.common import DEFAULTS

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {**DEFAULTS["allreduce"], "min_bytes": 8, "max_bytes": 1024, "timeout_s": 180}
MODEL_BYTES = 640 * 2

FAKE_SRUN = '''#!{python}
"""Test double for SLURM's srun: `--ntasks` copies of the command on this host (srun starts one per node), all
in one private network namespace with loopback only; SIGTERM is passed on; one copy failing stops the others
(--kill-on-bad-exit), and the exit status is non-zero."""
import os, signal, subprocess, sys, time

if os.environ.get("FAKE_SRUN_NS") != "1":
    os.environ["FAKE_SRUN_NS"] = "1"
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                          sys.executable, __file__, *sys.argv[1:]])
args, n = sys.argv[1:], 1
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag.startswith("--ntasks="):
        n = int(flag.split("=", 1)[1])
procs = [subprocess.Popen(args) for _ in range(n)]


def stop(*_):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)


signal.signal(signal.SIGTERM, stop)
while True:
    codes = [p.poll() for p in procs]
    if any(c not in (None, 0) for c in codes):
        stop()
        for p in procs:
            p.wait()
        sys.exit(1)
    if all(c == 0 for c in codes):
        sys.exit(0)
    time.sleep(0.2)
'''


# ------------------------------------------------------------------------------------------- without a launch
def test_rank_comes_from_RANK_under_torchrun_and_a_failure_leaves_its_reason(tmp_path):
    """`python -m decode_gap.microbench.allreduce job.json` (no rank argument) as torchrun starts it."""
    job = {"backend": "gloo", "world_size": 2, "init_method": "env://", "out_dir": str(tmp_path), "fail_rank": 1,
           "sizes": [8], "warmup": 1, "iters": 1, "type": "bfloat16", "op_timeout_s": 30}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"), RANK="1", LOCAL_RANK="0", WORLD_SIZE="2")
    done = subprocess.run([sys.executable, "-m", ar.MODULE, str(tmp_path / "job.json")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "injected failure on rank 1" in done.stderr
    err = json.loads((tmp_path / "rank1.error.json").read_text())
    assert err == {"rank": 1, "local_rank": 0, "host": socket.gethostname(), "device": "cpu",
                   "error": "RuntimeError: injected failure on rank 1"}
    assert json.loads((tmp_path / "rank1.where.json").read_text())["rank"] == 1

    env.pop("RANK")
    done = subprocess.run([sys.executable, "-m", ar.MODULE, str(tmp_path / "job.json")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "$RANK is not set" in done.stderr


def _double_launch(monkeypatch, write):
    """Replace fleet.run_launch by a test double that records the command and plays the ranks' part."""
    seen = {}

    def run_launch(cmd, timeout_s=None, env=None):
        seen.update(cmd=list(cmd), timeout_s=timeout_s)
        job = json.loads(Path(cmd[-1]).read_text())
        seen["job"] = job
        write(Path(job["out_dir"]), job)

    monkeypatch.setattr(fleet, "run_launch", run_launch)
    return seen


def test_launch_multinode_command_and_job_on_the_shared_filesystem(tmp_path, monkeypatch):
    def ranks_succeed(out: Path, job):
        for r in range(job["world_size"]):
            (out / f"rank{r}.json").write_text(json.dumps([{"rank": r}]))
            (out / f"rank{r}.where.json").write_text(json.dumps({"rank": r, "host": f"gpu-a0{7 + r // 8}"}))

    seen = _double_launch(monkeypatch, ranks_succeed)
    layout = fleet.AllreduceLayout(nodes=2, per_node=8, world_size=16)
    work = tmp_path / "microbench" / "allreduce.ranks"
    work.mkdir(parents=True)
    (work / "rank3.json").write_text("stale")  # an earlier run's file must not count
    per_rank, where = ar.launch_multinode({"backend": "nccl", "sizes": [8]}, layout, work, 600, gpus=True,
                                          env={"SLURM_JOB_ID": "4711"}, hosts=["gpu-a07", "gpu-a08"],
                                          launcher=["torchrun"])
    cmd = seen["cmd"]
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gres=gpu:8"]
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "gpu-a07:30111"
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--nproc-per-node") + 1] == "8"
    assert cmd[-3:] == ["-m", "decode_gap.microbench.allreduce", str(work.resolve() / "job.json")]
    assert seen["timeout_s"] == 600
    assert {k: seen["job"][k] for k in ("init_method", "world_size", "nodes", "out_dir", "backend")} == {
        "init_method": "env://", "world_size": 16, "nodes": 2, "out_dir": str(work.resolve()), "backend": "nccl"}
    assert [p[0]["rank"] for p in per_rank] == list(range(16))
    assert {w["host"] for w in where} == {"gpu-a07", "gpu-a08"}


def test_launch_multinode_failure_names_rank_node_and_reason(tmp_path, monkeypatch):
    def rank_fails(out: Path, job):
        (out / "rank0.json").write_text("[]")
        (out / "rank9.error.json").write_text(json.dumps(
            {"rank": 9, "host": "gpu-a08", "error": "torch.OutOfMemoryError: CUDA out of memory"}))
        raise DecodeGapError("srun exited with status 1: srun --nodes=2 ... torchrun ...")

    _double_launch(monkeypatch, rank_fails)
    layout = fleet.AllreduceLayout(nodes=2, per_node=8, world_size=16)
    with pytest.raises(DecodeGapError) as exc:
        ar.launch_multinode({"backend": "nccl"}, layout, tmp_path / "w", 60, gpus=True, env={"SLURM_JOB_ID": "1"},
                            hosts=["gpu-a07", "gpu-a08"])
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == ("all-reduce across 2 nodes (16 ranks): rank 9 on node gpu-a08 failed: torch.OutOfMemoryError: "
                   "CUDA out of memory; srun exited with status 1; the other ranks were stopped")


def test_launch_multinode_without_reasons_names_the_ranks_without_results(tmp_path, monkeypatch):
    def killed(out: Path, job):
        (out / "rank0.json").write_text("[]")
        (out / "rank1.where.json").write_text(json.dumps({"rank": 1, "host": "gpu-b02"}))
        raise DecodeGapError("srun did not finish within 60 s: srun --nodes=2 ...")

    _double_launch(monkeypatch, killed)
    want = (r"^all-reduce across 2 nodes \(2 ranks\): srun did not finish within 60 s; "
            r"rank\(s\) without results: 1 \(gpu-b02\)")
    with pytest.raises(DecodeGapError, match=want):
        ar.launch_multinode({"backend": "gloo"}, fleet.AllreduceLayout(2, 1, 2), tmp_path / "w", 60, gpus=False,
                            env={"SLURM_JOB_ID": "1"}, hosts=["gpu-b01", "gpu-b02"])


def test_stage_needs_a_work_dir_and_a_slurm_job():
    with pytest.raises(Exception, match="work_dir"):
        ar.run_allreduce_bench(2, 16, {**SETTINGS, "nodes": 2}, 1, 2, "cpu", 0, log=lambda s: None)


# ------------------------------------------------------------------------------------------- real launches
def _namespaces_allowed() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    ok = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return ok.returncode == 0


needs_netns = pytest.mark.skipif(
    not _namespaces_allowed(),
    reason="no private network namespace here (unshare --net): torchrun's stores would listen on every address",
)


@pytest.fixture
def fake_slurm(tmp_path):
    """PATH with the fake srun (a test double) first, and the variables of a SLURM job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID="77",
                DECODE_GAP_RDZV_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")


def _ranks_left(work: Path) -> list[int]:
    """Processes still running whose command line names the launch's job.json."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if str(work) in " ".join(p.info["cmdline"] or []):
            left.append(p.info["pid"])
    return left


@needs_netns
def test_one_node_torchrun_two_gloo_ranks_through_env(tmp_path, fake_slurm):
    """srun --nodes=1 + torchrun --nproc-per-node 2: two gloo ranks join through env:// and all-reduce."""
    layout = fleet.AllreduceLayout(nodes=1, per_node=2, world_size=2)
    job = {"backend": "gloo", "sizes": [8, 1024], "warmup": 1, "iters": 3, "type": "bfloat16", "op_timeout_s": 60}
    per_rank, where = ar.launch_multinode(job, layout, tmp_path / "ranks", 180, gpus=False, env=fake_slurm,
                                          hosts=["127.0.0.1"])
    assert len(per_rank) == 2 and all(r[i]["wrong"] == 0 for r in per_rank for i in range(2))
    assert [r[1]["count"] for r in per_rank] == [512, 512]
    assert [(w["rank"], w["local_rank"], w["device"]) for w in where] == [(0, 0, "cpu"), (1, 1, "cpu")]


@needs_netns
def test_two_node_stage_has_the_single_node_shape(tmp_path, fake_slurm):
    """The stage with nodes: 2 (two torchrun agents, one rank each, meeting through c10d) against the same
    stage on one node: the same CSV columns and rows, the same JSON keys plus nodes, ranks_per_node, hosts."""
    settings = {**SETTINGS, "nodes": 2, "work_dir": str(tmp_path / "microbench" / "allreduce.ranks"),
                "launch": {"env": fake_slurm, "hosts": ["127.0.0.1", "127.0.0.1"]}}
    df_m, js_m = ar.run_allreduce_bench(2, MODEL_BYTES, settings, 1, 3, "cpu", 0, log=lambda s: None)
    df_1, js_1 = ar.run_allreduce_bench(2, MODEL_BYTES, SETTINGS, 1, 3, "cpu", 0, log=lambda s: None)
    for name, df, js in (("multi", df_m, js_m), ("single", df_1, js_1)):
        write_table(tmp_path / name / "allreduce.csv", df)
        write_json(tmp_path / name / "allreduce.json", js)
    csv_m, csv_1 = (pd.read_csv(tmp_path / n / "allreduce.csv") for n in ("multi", "single"))
    assert list(csv_m.columns) == list(csv_1.columns) == ar.COLUMNS
    assert list(csv_m.dtypes) == list(csv_1.dtypes)
    assert csv_m[["size", "count", "mode", "world_size", "backend"]].equals(
        csv_1[["size", "count", "mode", "world_size", "backend"]])
    assert (csv_m["wrong"] == 0).all() and (csv_m["time_us"] > 0).all()
    jm, j1 = (json.loads((tmp_path / n / "allreduce.json").read_text()) for n in ("multi", "single"))
    assert set(jm) - set(j1) == {"ranks_per_node", "hosts"} and set(j1) <= set(jm)
    assert set(jm["figures"]) == set(j1["figures"])
    assert (jm["nodes"], jm["ranks_per_node"], jm["world_size"], jm["measured_world_size"]) == (2, 1, 2, 2)
    assert j1["nodes"] == 1 and jm["hosts"] == [socket.gethostname()]
    fig = jm["figures"]["allreduce_us_at_model_size"]
    assert fig["status"] == "measured" and fig["value"] > 0 and fig["source"].endswith("across 2 nodes (1 per node)")
    assert jm["figures"]["allreduce_us_at_model_size_multi_gpu"]["status"] == "measured"
    assert any(s["case"] == "nccl-tests" for s in jm["skipped"])


@needs_netns
def test_a_failing_rank_on_the_second_node_is_named_and_nothing_is_left(tmp_path, fake_slurm):
    settings = {**SETTINGS, "nodes": 2, "work_dir": str(tmp_path / "ranks"),
                "launch": {"env": fake_slurm, "hosts": ["127.0.0.1", "127.0.0.1"]}}
    with pytest.raises(DecodeGapError) as exc:
        ar.run_allreduce_bench(2, 16, settings, 1, 2, "cpu", 0, log=lambda s: None, fail_rank=1)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"all-reduce across 2 nodes (2 ranks): rank 1 on node {socket.gethostname()} failed: "
                          "RuntimeError: injected failure on rank 1; srun exited with status 1")
    assert not _ranks_left(tmp_path / "ranks")


@needs_netns
def test_a_hung_launch_is_stopped_at_the_deadline(tmp_path, fake_slurm):
    settings = {**SETTINGS, "nodes": 2, "timeout_s": 20, "work_dir": str(tmp_path / "ranks"),
                "launch": {"env": fake_slurm, "hosts": ["127.0.0.1", "127.0.0.1"]}}
    with pytest.raises(DecodeGapError, match=r"srun did not finish within 20 s; rank\(s\) without results: 0 .*1 "):
        ar.run_allreduce_bench(2, 16, settings, 1, 2, "cpu", 0, log=lambda s: None, hang_rank=1)
    assert not _ranks_left(tmp_path / "ranks")
