"""Kubernetes: the pipeline as one Job per node type, inside one pod on a GPU node (docs/kubernetes.md).

A decode investigation measures one host: the audit reads that node's kernel settings, the micro-benchmarks time its
GPUs and the live stage streams from where it runs. So on Kubernetes the whole DAG runs in one pod
(`snakemake --cores all <target>`), not a pod per rule: a pod per rule would audit one node and time another.

`python -m decode_gap.kube job --image IMG --pvc CLAIM --gpus 8 --gpu-product NVIDIA-H200 -- tp=8 endpoint=...`
prints the Job's manifest (for `kubectl apply -f -`). It checks the `--config` values against the schema and the model
card first, so a typo fails here in one line and not in a pod an hour later. The pod:
- asks for `--gpus` whole GPUs (`nvidia.com/gpu`, the NVIDIA device plugin), on nodes whose GPU feature discovery
  label `nvidia.com/gpu.product` is `--gpu-product` (and on `--node` where given), tolerating the usual GPU taint;
- keeps `results/`, `report/archive/` and `.snakemake/` on the PersistentVolumeClaim `--pvc` (subPaths), so cached
  stages stay cached from one Job to the next (a driver upgrade reruns only what it invalidates) and no archived
  report is lost with the pod;
- gets a memory-backed /dev/shm (NCCL's buffers between the ranks of the all-reduce; a container's 64 MiB is too
  small) and never runs a second time on its own (`backoffLimit: 0`: a benchmark that failed says why, once);
- reads the server's API key from a Secret (`--api-key-secret NAME/KEY`) into the variable `api_key_env` names: the
  manifest holds the Secret's name, never its value.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from .errors import ConfigError, DecodeGapError

REPO = Path(__file__).resolve().parents[2]
WORKDIR = "/opt/decode-gap"  # the repository inside the image (envs/Dockerfile)
# what outlives the pod, as (subPath on the claim, path under WORKDIR)
PERSISTED = (("results", "results"), ("archive", "report/archive"), ("snakemake", ".snakemake"))
TARGETS = ("report", "audit", "roofline", "microbench", "simulate", "live", "trace")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery (GPU operator)
DEFAULT_KEY_ENV = "DECODE_GAP_API_KEY"
SECRET_REF = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/([-._a-zA-Z0-9]+)$")


@dataclass(frozen=True)
class JobSpec:
    """What a Job needs beyond the pipeline's own config."""

    image: str
    pvc: str
    gpus: int = 0
    gpu_product: str = ""
    node: str = ""
    target: str = "report"
    name: str = ""
    namespace: str = ""
    api_key_secret: str = ""  # "secret-name/key"
    cpu: str = "8"
    memory: str = "64Gi"
    shm: str = "16Gi"
    deadline_s: int = 6 * 3600
    overrides: Sequence[str] = field(default_factory=tuple)  # `key=value` as for snakemake --config


def parse_overrides(entries: Sequence[str]) -> dict[str, Any]:
    """`key=value` entries parsed as `snakemake --config` parses them (int, float, True/False, YAML, else the
    string), so the check here sees the values the pod's Snakemake will. Written out because the package never
    imports snakemake (its import contract); the entries themselves go to the pod verbatim."""
    out: dict[str, Any] = {}
    for entry in entries:
        key, sep, raw = entry.partition("=")
        if not sep or not re.fullmatch(r"[a-zA-Z_][\w-]*\w|[a-zA-Z_]", key):
            raise ConfigError(f"--config entry {entry!r}: expected name=value")
        out[key] = None if raw == "" else _parse_value(raw)
    return out


def _parse_value(raw: str) -> Any:
    for parse in (int, float):
        try:
            return parse(raw)
        except ValueError:
            pass
    if raw in ("True", "False"):
        return raw == "True"
    try:
        value = yaml.load(raw, Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        return raw
    return raw if value is None else value


def check_config(overrides: Mapping[str, Any], repo: Path = REPO) -> dict[str, Any]:
    """The run's config (config/config.yaml with the overrides) checked as the pod's Snakefile will check it: the
    schema, the model card, a named hardware spec. Returns it; a problem raises ConfigError in one line."""
    import jsonschema

    from .config import deep_merge, one_line_validation_error, repo_path, schema, typed_cli_values
    from .hardware import resolve_hardware
    from .model import load_model_card

    configfile = repo / "config" / "config.yaml"
    rules = schema()  # the package's own (the Snakefile validates against the same file)
    given = typed_cli_values(dict(overrides), rules)
    config = deep_merge(yaml.safe_load(configfile.read_text(encoding="utf-8")) or {}, given)
    try:
        jsonschema.validators.validator_for(rules)(rules).validate(config)
    except jsonschema.ValidationError as exc:
        line = one_line_validation_error(exc, [str(configfile)], dict(overrides))
        raise ConfigError(line.removeprefix("decode-gap: error: ")) from None
    model = config.get("model")
    if model:
        load_model_card(repo_path(repo, model))
    if config.get("hardware", "auto") != "auto":
        resolve_hardware(config["hardware"], repo / "config" / "hardware")
    return config


def _dns_name(text: str) -> str:
    """A DNS-1123 label (what a Job's name must be): lower case, dashes, at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:63].rstrip("-") or "decode-gap"


def job_manifest(spec: JobSpec, repo: Path = REPO) -> dict[str, Any]:
    """The batch/v1 Job for `spec` (module docstring), its config checked first (check_config)."""
    if spec.target not in TARGETS:
        raise ConfigError(f"--target: {spec.target!r} is not one of {', '.join(TARGETS)}")
    if spec.gpus < 0:
        raise ConfigError(f"--gpus: {spec.gpus} is negative")
    if spec.gpu_product and not spec.gpus:
        raise ConfigError(f"--gpu-product {spec.gpu_product} without --gpus: the pod would see no GPU of that node and "
                          f"measure its CPU; ask for the GPUs (tp at least)")
    if not spec.image or not spec.pvc:
        raise ConfigError("--image and --pvc are required: the image holds decode-gap, the claim keeps the results")
    overrides = parse_overrides(spec.overrides)
    config = check_config(overrides, repo)
    entries = list(spec.overrides)
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.api_key_secret:
        ref = SECRET_REF.match(spec.api_key_secret)
        if not ref:
            raise ConfigError(f"--api-key-secret: {spec.api_key_secret!r}: expected SECRET-NAME/KEY")
        key_env = config.get("api_key_env") or DEFAULT_KEY_ENV
        if not config.get("api_key_env"):
            entries.append(f"api_key_env={key_env}")
        env.append({"name": key_env, "valueFrom": {"secretKeyRef": {"name": ref.group(1), "key": ref.group(3)}}})
    elif config.get("api_key_env"):
        raise ConfigError(f"config field 'api_key_env': {config['api_key_env']} would be unset in the pod: "
                          f"pass --api-key-secret SECRET-NAME/KEY (the Secret holding the server's key)")
    if not config.get("endpoint") and config.get("stages", {}).get("live", True) and spec.target in ("report", "live"):
        print("decode-gap: note: no endpoint: the pod measures the embedded llama.cpp server, which the image does "
              "not hold unless it was built with the live extra (docs/kubernetes.md)", file=sys.stderr)
    tp = int(config.get("tp") or 1)
    if spec.gpus and spec.gpus < tp:
        print(f"decode-gap: note: {spec.gpus} GPU(s) for tp={tp}: one rank stands for the group and the all-reduces "
              f"are modelled (README, tensor parallelism); ask for --gpus {tp} to measure them", file=sys.stderr)
    command = ["snakemake", "--cores", "all", spec.target]
    if entries:
        command += ["--config", *entries]
    resources: dict[str, Any] = {"requests": {"cpu": spec.cpu, "memory": spec.memory},
                                 "limits": {"memory": spec.memory}}
    if spec.gpus:
        resources["limits"][GPU_RESOURCE] = spec.gpus
        resources["requests"][GPU_RESOURCE] = spec.gpus
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "decode-gap",
            "image": spec.image,
            "workingDir": WORKDIR,
            "command": command,
            "env": env,
            "resources": resources,
            "volumeMounts": [{"name": "results", "mountPath": f"{WORKDIR}/{path}", "subPath": sub}
                             for sub, path in PERSISTED] + [{"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "results", "persistentVolumeClaim": {"claimName": spec.pvc}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm}}],
    }
    selector = {}
    if spec.gpu_product:
        selector[GPU_PRODUCT_LABEL] = spec.gpu_product
    if spec.node:
        selector["kubernetes.io/hostname"] = spec.node
    if selector:
        pod["nodeSelector"] = selector
    if spec.gpus:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    name = _dns_name(spec.name or f"decode-gap-{spec.gpu_product or 'cpu'}-{spec.gpus}gpu-{spec.target}")
    labels = {"app.kubernetes.io/name": "decode-gap", "decode-gap/target": spec.target}
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.deadline_s,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},  # a copy: no YAML alias in the output
        },
    }


def render(manifest: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)


def _cli(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_gap.kube", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    job = sub.add_parser("job", help="print a Job that runs the pipeline in one pod (kubectl apply -f -)")
    job.add_argument("--image", required=True, help="the decode-gap image (envs/Dockerfile), pushed to your registry")
    job.add_argument("--pvc", required=True, help="PersistentVolumeClaim for results/, report/archive/, .snakemake/")
    job.add_argument("--gpus", type=int, default=0, help="whole GPUs the pod asks for (nvidia.com/gpu); tp at least")
    job.add_argument("--gpu-product", default="", help="node label nvidia.com/gpu.product, e.g. NVIDIA-H200")
    job.add_argument("--node", default="", help="run on this node (kubernetes.io/hostname)")
    job.add_argument("--target", default="report", choices=TARGETS)
    job.add_argument("--name", default="", help="the Job's name (default: from the GPU product, count and target)")
    job.add_argument("--namespace", default="")
    job.add_argument("--api-key-secret", default="", help="SECRET-NAME/KEY holding the server's API key")
    job.add_argument("--cpu", default=JobSpec.cpu, help="CPU request (the pod's threads: --cores all)")
    job.add_argument("--memory", default=JobSpec.memory, help="memory request and limit")
    job.add_argument("--shm", default=JobSpec.shm, help="size of the memory-backed /dev/shm")
    job.add_argument("--deadline-s", type=int, default=JobSpec.deadline_s, help="activeDeadlineSeconds")
    job.add_argument("overrides", nargs="*", metavar="key=value", help="the run's --config values, after --")
    a = ap.parse_args(argv)
    spec = JobSpec(image=a.image, pvc=a.pvc, gpus=a.gpus, gpu_product=a.gpu_product, node=a.node, target=a.target,
                   name=a.name, namespace=a.namespace, api_key_secret=a.api_key_secret, cpu=a.cpu, memory=a.memory,
                   shm=a.shm, deadline_s=a.deadline_s, overrides=tuple(a.overrides))
    try:
        sys.stdout.write(render(job_manifest(spec)))
    except DecodeGapError as exc:
        print(f"decode-gap: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli())
