"""Kubernetes Jobs (decode_gap.kube): the manifest a node type's run gets, checked against Kubernetes' own schema
(kubernetes-validate, offline), its config checked before any pod starts, and no secret in it. No cluster runs here:
the manifest is what is tested, and the image (envs/Dockerfile) is held to setup.sh's system packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from decode_gap import kube
from decode_gap.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TP8 = ("tp=8", "endpoint=http://sglang.serving.svc:30000/v1", "model=config/models/glm-5.json",
       "weight_format=nvfp4", "hardware=h200")


def _job(**kw) -> dict:
    spec = dict(image="registry.example/decode-gap:0.1", pvc="decode-gap-h200", gpus=8, gpu_product="NVIDIA-H200",
                overrides=TP8)
    return kube.job_manifest(kube.JobSpec(**{**spec, **kw}))


def _container(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def test_a_tp8_job_runs_the_whole_dag_in_one_pod_on_the_node_type():
    job = _job()
    pod = job["spec"]["template"]["spec"]
    c = _container(job)
    assert c["command"] == ["snakemake", "--cores", "all", "report", "--config", *TP8]
    assert c["workingDir"] == kube.WORKDIR
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    # cached stages and archived reports outlive the pod: all three on the claim
    mounts = {m["mountPath"]: m.get("subPath") for m in c["volumeMounts"] if m["name"] == "results"}
    assert mounts == {f"{kube.WORKDIR}/results": "results", f"{kube.WORKDIR}/report/archive": "archive",
                      f"{kube.WORKDIR}/.snakemake": "snakemake"}
    assert {"name": "results", "persistentVolumeClaim": {"claimName": "decode-gap-h200"}} in pod["volumes"]
    # NCCL's buffers: a memory-backed /dev/shm, not the container's 64 MiB
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert job["metadata"]["name"] == "decode-gap-nvidia-h200-8gpu-report"


@pytest.mark.parametrize("kw", [{}, {"gpus": 0, "gpu_product": "", "target": "audit", "overrides": ()},
                                {"api_key_secret": "sglang-key/api-key", "namespace": "perf", "node": "gpu-node-7"}])
def test_the_manifest_is_valid_for_kubernetes(kw):
    kv = pytest.importorskip("kubernetes_validate")
    text = kube.render(_job(**kw))
    assert "&id" not in text and "*id" not in text  # no YAML aliases: plain for kubectl and for a reader
    kv.validate(yaml.safe_load(text), kv.latest_version(), strict=True)


def test_the_api_key_comes_from_a_secret_and_never_lands_in_the_manifest(monkeypatch):
    secret = "sk-live-SECRET-0123456789"
    monkeypatch.setenv("DECODE_GAP_API_KEY", secret)
    monkeypatch.setenv("MY_KEY", secret)
    job = _job(api_key_secret="sglang-key/api-key")
    env = {e["name"]: e for e in _container(job)["env"]}
    assert env["DECODE_GAP_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "sglang-key", "key": "api-key"}}
    assert "api_key_env=DECODE_GAP_API_KEY" in _container(job)["command"]
    named = _job(api_key_secret="sglang-key/api-key", overrides=(*TP8, "api_key_env=MY_KEY"))
    assert "MY_KEY" in {e["name"] for e in _container(named)["env"]}
    for manifest in (job, named):
        assert secret not in kube.render(manifest)
    with pytest.raises(ConfigError, match="api_key_env.*--api-key-secret"):
        _job(overrides=(*TP8, "api_key_env=MY_KEY"))  # the pod would have no such variable
    with pytest.raises(ConfigError, match="--api-key-secret"):
        _job(api_key_secret="no-key-given")


def test_a_gpu_node_type_without_gpus_is_refused():
    with pytest.raises(ConfigError, match="without --gpus"):
        _job(gpus=0)  # on an H200 node, but the pod would see no GPU and time the CPU


@pytest.mark.parametrize("entry,field", [("tp=abc", "'tp'"), ("tpp=3", "'tpp'"), ("hardware=h900", "'hardware'"),
                                         ("model=config/models/nope.json", "nope.json")])
def test_a_bad_config_fails_before_any_pod_in_one_line(entry, field):
    with pytest.raises(ConfigError) as err:
        _job(overrides=(entry,))
    assert field in str(err.value) and "\n" not in str(err.value)


def test_config_values_parse_as_snakemake_parses_them():
    """The check sees what the pod's Snakemake will (the entries themselves go to it verbatim)."""
    from snakemake.cli import parse_config

    entries = ["tp=8", "context_len=2048.5", "flag=True", "other=false", "endpoint=http://a:1/v1", "empty=",
               "stages={live: False}", "batch_size=[1, 8]", "name=x=y"]
    assert kube.parse_overrides(entries) == parse_config(entries)
    with pytest.raises(ConfigError, match="name=value"):
        kube.parse_overrides(["no-equals-sign"])


def test_the_cli_prints_a_manifest_or_one_line(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "decode_gap.kube", "job", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=tmp_path)
    ok = run("--image", "img", "--pvc", "claim", "--gpus", "2", "--", "tp=2", "endpoint=http://a:1/v1")
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["kind"] == "Job"
    bad = run("--image", "img", "--pvc", "claim", "--", "tp=abc")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == ["decode-gap: error: --config: field 'tp': 'abc' is not of type "
                                               "'integer'"]


def test_the_image_holds_what_setup_sh_installs_and_leaves_results_out():
    dockerfile = (REPO / "envs" / "Dockerfile").read_text()
    setup = (REPO / "setup.sh").read_text()
    assert f"WORKDIR {kube.WORKDIR}" in dockerfile
    for package in ("libpango-1.0-0", "libpangoft2-1.0-0", "libharfbuzz-subset0", "fonts-liberation", "pciutils"):
        assert package in dockerfile and package in setup, package
    ignored = (REPO / ".dockerignore").read_text().split()
    for local in (".venv", "results", ".snakemake", "report/archive/*"):
        assert local in ignored, local
