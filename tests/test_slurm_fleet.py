"""Fleet helpers (decode_gap.fleet) and the SLURM profile: what runs without a cluster.

The one-node torchrun launch at the end is real: torchrun, its c10d rendezvous and a gloo all-reduce over two
processes, inside a private network namespace (only loopback exists there) when `unshare` is available.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from decode_gap import fleet  # noqa: E402
from decode_gap.errors import ConfigError, DecodeGapError  # noqa: E402
from decode_gap.host import free_port  # noqa: E402

PROFILE = REPO / "workflow" / "profiles" / "slurm" / "config.v8+.yaml"
LOCAL_RULES = ("render_report", "archive_report", "attribute_gap", "merge_simulation", "assemble_gguf", "compare_runs")
PROFILE_ENV = (
    "DECODE_GAP_SLURM_PARTITION",
    "DECODE_GAP_SLURM_CONSTRAINT",
    "DECODE_GAP_SLURM_ACCOUNT",
    "DECODE_GAP_SLURM_GPU_MODEL",
    "DECODE_GAP_SLURM_EXTRA",
)


# ------------------------------------------------------------------------------------------- layout, resources
def test_layout_defaults_to_tp_on_one_node():
    lay = fleet.allreduce_layout({"tp": 8, "microbench": {"allreduce": {"world_size": None}}})
    assert (lay.nodes, lay.per_node, lay.world_size, lay.multinode) == (1, 8, 8, False)


def test_layout_splits_world_over_nodes():
    lay = fleet.allreduce_layout({"tp": 8, "microbench": {"allreduce": {"world_size": 16, "nodes": 2}}})
    assert (lay.nodes, lay.per_node, lay.world_size, lay.multinode) == (2, 8, 16, True)


def test_layout_uneven_split_names_the_field():
    with pytest.raises(ConfigError, match=r"microbench\.allreduce\.world_size.*nodes=4"):
        fleet.allreduce_layout({"tp": 1, "microbench": {"allreduce": {"world_size": 6, "nodes": 4}}})


def test_resources_one_node():
    cfg = {"tp": 4, "microbench": {"allreduce": {}}}
    assert fleet.allreduce_resources(cfg, gpu_host=True) == {"gpu": 4}
    assert fleet.allreduce_resources(cfg, gpu_host=False) == {"gpu": 0}


def test_resources_several_nodes():
    cfg = {"tp": 8, "microbench": {"allreduce": {"world_size": 32, "nodes": 4}}}
    res = fleet.allreduce_resources(cfg, gpu_host=True)
    assert res == {"nodes": 4, "tasks": 4, "mpi": "srun", "tasks_per_gpu": 0, "gres": "gpu:8"}
    assert "gres" not in fleet.allreduce_resources(cfg, gpu_host=False)


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("snakemake_executor_plugin_slurm"),
    reason="snakemake-executor-plugin-slurm not installed (pip install -e '.[slurm]')",
)
def test_resources_make_the_sbatch_line_we_want():
    """The plugin's own sbatch builder, fed a job with our resources (the job object is a test double)."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Res(dict):
        __getattr__ = dict.__getitem__

    cfg = {"tp": 8, "microbench": {"allreduce": {"world_size": 16, "nodes": 2}}}
    job = SimpleNamespace(
        resources=Res(fleet.allreduce_resources(cfg, gpu_host=True), runtime=30, mem_mb=8000),
        threads=4,
        is_group=lambda: False,
    )
    params = {
        "run_uuid": "u",
        "slurm_logfile": "/tmp/x/%j.log",
        "comment_str": "rule_bench_allreduce",
        "account": "",
        "partition": " -p h200",
        "workdir": "/w",
    }
    call = get_submit_command(job, params) + set_gres_string(job)
    assert "--nodes=2" in call and "--ntasks=2" in call and "--gres=gpu:8" in call
    assert "--ntasks-per-gpu" not in call and "--gpus=" not in call
    one = SimpleNamespace(
        resources=Res(fleet.allreduce_resources({"tp": 4}, gpu_host=True)), threads=4, is_group=lambda: False
    )
    assert set_gres_string(one).strip() == "--gpus=4"


# ------------------------------------------------------------------------------------------- commands
def test_torchrun_command():
    cmd = fleet.torchrun_command(
        nodes=2,
        nproc_per_node=8,
        endpoint="gpu-a01:29412",
        rdzv_id="decode-gap-12",
        module="decode_gap.microbench.allreduce",
        module_args=["--out", "/x"],
        launcher=["torchrun"],
    )
    assert cmd == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "gpu-a01:29412",
        "--rdzv-id",
        "decode-gap-12",
        "--max-restarts",
        "0",
        "-m",
        "decode_gap.microbench.allreduce",
        "--out",
        "/x",
    ]


def test_torchrun_launcher_is_the_venvs():
    launcher = fleet.torchrun_launcher()
    assert launcher[0].startswith(str(Path(sys.executable).parent)) or launcher[:3] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
    ]


def test_multinode_command_rendezvous_on_first_host():
    lay = fleet.AllreduceLayout(nodes=2, per_node=8, world_size=16)
    cmd = fleet.multinode_command(
        lay,
        module="m",
        module_args=["a"],
        gpus=True,
        env={"SLURM_JOB_ID": "4711"},
        hosts=["gpu-a07", "gpu-a08"],
        launcher=["torchrun"],
    )
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gres=gpu:8"]
    rest = cmd[6:]
    assert rest[0] == "torchrun"
    assert rest[rest.index("--rdzv-endpoint") + 1] == "gpu-a07:30111"  # 29400 + 4711 % 1000
    assert rest[rest.index("--nnodes") + 1] == "2" and rest[rest.index("--nproc-per-node") + 1] == "8"
    assert rest[-3:] == ["-m", "m", "a"]


def test_multinode_command_cpu_has_no_gres_and_port_override():
    lay = fleet.AllreduceLayout(nodes=2, per_node=2, world_size=4)
    env = {"SLURM_JOB_ID": "9", fleet.RDZV_PORT_ENV: "31000"}
    cmd = fleet.multinode_command(lay, module="m", gpus=False, env=env, hosts=["a", "b"], launcher=["torchrun"])
    assert not any(c.startswith("--gres") for c in cmd)
    assert "a:31000" in cmd


def test_multinode_command_errors_are_one_line():
    lay = fleet.AllreduceLayout(nodes=4, per_node=8, world_size=32)
    with pytest.raises(DecodeGapError, match="4 nodes wanted, the SLURM job 7 holds 2"):
        fleet.multinode_command(lay, module="m", gpus=True, env={"SLURM_JOB_ID": "7"}, hosts=["a", "b"])
    with pytest.raises(DecodeGapError, match="needs a SLURM allocation"):
        fleet.job_hostnames(env={})
    with pytest.raises(DecodeGapError, match=fleet.RDZV_PORT_ENV):
        fleet.rendezvous_port("1", env={fleet.RDZV_PORT_ENV: "http"})


def test_detect_command():
    cmd = fleet.detect_command(partition="h200", constraint="nvlink", python="/venv/bin/python")
    assert cmd == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",
        "--partition=h200",
        "--constraint=nvlink",
        "/venv/bin/python",
        "-m",
        "decode_gap.fleet",
        "identify",
    ]
    assert "--exclusive" not in fleet.detect_command(exclusive=False)


def test_identity_round_trip_and_config_args():
    ident = fleet.node_identity()
    assert ident["hardware_revision"] and ident["hardware"]
    assert set(ident["fingerprint"]) >= {"driver", "kernel", "torch"}  # what the cluster DAG compares against
    out = "srun: warning: something\n" + json.dumps(ident) + "\n"
    assert fleet.parse_identity(out) == ident
    if ident["hardware"] != "unknown-gpu":
        assert (
            fleet.config_args(ident) == f"hardware={ident['hardware']} hardware_revision={ident['hardware_revision']}"
        )
    with pytest.raises(DecodeGapError, match="matches no spec"):
        fleet.config_args({"host": "n1", "gpus": ["NVIDIA X9"], "hardware": "unknown-gpu", "hardware_revision": "x"})
    with pytest.raises(DecodeGapError, match="no identity"):
        fleet.parse_identity("srun: error: nope\n")


def test_identify_cli_prints_json():
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
    out = subprocess.run(
        [sys.executable, "-m", "decode_gap.fleet", "identify"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout)["hardware_revision"]


@pytest.mark.skipif(not shutil.which("scontrol"), reason="scontrol not found (apt-get install -y slurm-wlm)")
def test_rendezvous_check_dry_run_inside_an_allocation(tmp_path):
    """The CLI as it runs under salloc: SLURM's variables name the allocation; scontrol expands its node list."""
    conf = tmp_path / "slurm.conf"  # scontrol needs a config to start, not a controller, to expand host lists
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost\n")
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO / "workflow"),
        SLURM_CONF=str(conf),
        SLURM_JOB_NODELIST="gpu-a[07-08]",
        SLURM_JOB_ID="4711",
        SLURM_JOB_GPUS="0,1,2,3,4,5,6,7",
    )
    out = subprocess.run(
        [sys.executable, "-m", "decode_gap.fleet", "rendezvous-check", "--nproc-per-node", "8", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    cmd = out.stdout.split()
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gres=gpu:8"]
    assert "gpu-a07:30111" in cmd and cmd[-3:] == ["-m", "decode_gap.fleet", "rendezvous-worker"]
    env.pop("SLURM_JOB_NODELIST")
    out = subprocess.run(
        [sys.executable, "-m", "decode_gap.fleet", "rendezvous-check", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and out.stderr.strip().startswith("decode-gap: error:")
    assert len(out.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------- one-node torchrun
def _isolated_net() -> list[str] | None:
    """`unshare --net` with loopback up, when this host allows it (root, a kernel with network namespaces)."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return None
    ok = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if ok.returncode == 0 else None


def test_one_node_torchrun_rendezvous_allreduce():
    """torchrun --nnodes 1 --nproc-per-node 2 with the c10d rendezvous, a real gloo all-reduce of ones."""
    pytest.importorskip("torch")
    cmd = fleet.torchrun_command(
        nodes=1,
        nproc_per_node=2,
        endpoint=f"127.0.0.1:{free_port()}",
        rdzv_id="decode-gap-test",
        module="decode_gap.fleet",
        module_args=["rendezvous-worker"],
    )
    wrap = _isolated_net()
    if wrap is None:
        pytest.skip(
            "no private network namespace here (unshare --net): torchrun's stores would listen on every address"
        )
    env = fleet.launch_env(dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"))
    out = subprocess.run([*wrap, *cmd], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary == {
        "rank": 0,
        "world_size": 2,
        "backend": "gloo",
        "allreduce_sum": 2.0,
        "ok": True,
        "hosts": [socket.gethostname()],
    }


# ------------------------------------------------------------------------------------------- the profile
def _profile(env: dict[str, str], monkeypatch) -> dict:
    snakemake_profiles = pytest.importorskip("snakemake.profiles")
    for name in PROFILE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with open(PROFILE) as fh:
        return dict(snakemake_profiles.ProfileConfigFileParser().parse(fh))


def test_profile_without_env_uses_cluster_defaults(monkeypatch):
    prof = _profile({}, monkeypatch)
    assert prof["executor"] == "slurm"
    assert {"jobs", "latency-wait", "retries", "default-resources", "set-resources", "set-threads"} <= set(prof)
    defaults = dict(item.split("=", 1) for item in prof["default-resources"])
    assert set(defaults) == {"mem_mb", "runtime"}
    assert not any("gpu_model" in item for item in prof["set-resources"])


def test_profile_env_selects_the_node_type(monkeypatch):
    prof = _profile(
        {
            "DECODE_GAP_SLURM_PARTITION": "h200",
            "DECODE_GAP_SLURM_CONSTRAINT": "nvlink",
            "DECODE_GAP_SLURM_ACCOUNT": "perf",
            "DECODE_GAP_SLURM_GPU_MODEL": "h200",
            "DECODE_GAP_SLURM_EXTRA": "--exclusive",
        },
        monkeypatch,
    )
    defaults = dict(item.split("=", 1) for item in prof["default-resources"])
    assert defaults["slurm_partition"] == "h200" and defaults["constraint"] == "nvlink"
    assert defaults["slurm_account"] == "perf" and defaults["slurm_extra"] == "'--exclusive'"
    gpu_model_rules = {item.split(":", 1)[0] for item in prof["set-resources"] if ":gpu_model=" in item}
    assert gpu_model_rules == {
        "measure_memory",
        "bench_allreduce",
        "bench_gemm",
        "bench_moe",
        "bench_attention",
        "bench_launch",
        "simulate_kernel",
        "simulate_engine",
        "record_engine_trace",
    }


def _rules_in_workflow() -> dict[str, str]:
    """rule name -> its text, from workflow/rules/*.smk (rules that run something; not the target rules)."""
    rules = {}
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, flags=re.M | re.S):
            if re.search(r"^    (script|shell|run|wrapper|notebook):", m.group(2), flags=re.M):
                rules[m.group(1)] = m.group(2)
    return rules


def test_profile_names_only_real_rules_and_local_rules_stay_local(monkeypatch):
    prof = _profile({}, monkeypatch)
    rules = _rules_in_workflow()
    named = {item.split(":", 1)[0] for item in prof["set-resources"]} | {
        item.split("=", 1)[0] for item in prof["set-threads"]
    }
    assert named <= set(rules), f"profile names rules the workflow lacks: {sorted(named - set(rules))}"
    for rule in LOCAL_RULES:
        assert "localrule: True" in rules[rule], f"rule {rule} should run on the submit host (localrule: True)"
    for rule in named:
        assert "localrule: True" not in rules[rule], f"rule {rule} is local; its cluster resources do nothing"
    cluster_rules = {name for name, body in rules.items() if "localrule: True" not in body}
    unnamed = cluster_rules - {item.split(":", 1)[0] for item in prof["set-resources"]}
    assert not unnamed, f"cluster rules without resources in {PROFILE.relative_to(REPO)}: {sorted(unnamed)}"


# ------------------------------------------------------------------------------------------- run_launch
def test_run_launch_failure_is_one_line():
    with pytest.raises(DecodeGapError, match=r"^\S+ exited with status 3: ") as exc:
        fleet.run_launch([sys.executable, "-c", "raise SystemExit(3)"], timeout_s=60)
    assert "\n" not in str(exc.value)
    with pytest.raises(DecodeGapError, match="no-such-launcher not found"):
        fleet.run_launch(["no-such-launcher"], timeout_s=60)


def test_run_launch_past_its_deadline_leaves_no_process(tmp_path):
    """A launch that ignores SIGTERM, with a child of its own: both are gone when run_launch returns."""
    pids = tmp_path / "pids"
    code = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(DecodeGapError, match=r"did not finish within 10 s"):
        fleet.run_launch([sys.executable, "-c", code], timeout_s=10, grace_s=1)
    for pid in map(int, pids.read_text().split()):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie (exited, not yet reaped by its parent) counts as gone
        assert open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"), f"pid {pid} still running"
