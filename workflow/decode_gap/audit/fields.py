"""A field of audit.json: a value with its source, or "unavailable: <why>". Secret redaction lives here too."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from ..errors import describe
from ..secrets import REDACTED  # the one marker for every stage and the report

# An environment variable whose name contains one of these is never written, only the REDACTED marker.
SECRET_NAME_RE = re.compile(
    r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|SIGNATURE|CERT",
    re.I,
)
# Values that look like a credential whatever the variable's name (Hugging Face, OpenAI, GitHub, Slack, AWS, JWT).
SECRET_VALUE_RE = re.compile(
    r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_\-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+)"
)
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_")


def ok(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def na(why: str, source: str = "") -> dict[str, Any]:
    return {"value": None, "source": source, "status": "unavailable", "why": why}


def is_ok(field: Any) -> bool:
    return isinstance(field, dict) and "value" in field and field.get("status") != "unavailable"


def value(field: Any, default: Any = None) -> Any:
    return field["value"] if is_ok(field) else default


def field_text(field: Any) -> str:
    """How the report shows a field: its value, or "unavailable: <why>"."""
    if is_ok(field):
        return str(field["value"])
    if isinstance(field, dict):
        return f"unavailable: {field.get('why', 'not collected')}"
    return "unavailable: not collected"


def first(*attempts: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The first attempt that yields a value; otherwise unavailable with every attempt's reason, in order."""
    whys, sources = [], []
    for attempt in attempts:
        try:
            field = attempt()
        except Exception as exc:  # a probe failing is data ("unavailable: why"), never a crash
            field = na(describe(exc, 300))
        if is_ok(field) and field["value"] is not None:
            return field
        if field.get("source"):
            sources.append(field["source"])
        whys.append(field.get("why") or "no value")
    return na("; ".join(dict.fromkeys(whys)), ", ".join(dict.fromkeys(sources)))


def unavailable_map(obj: Any, prefix: str = "") -> dict[str, str]:
    """Every unavailable field in a nested audit dict: {"host.sockets": "unavailable: ..."}."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        if obj.get("status") == "unavailable" and "why" in obj and "value" in obj:
            out[prefix] = f"unavailable: {obj['why']}"
            return out
        for k, v in obj.items():
            if k in ("findings", "not_checked", "unavailable", "summary"):
                continue
            out.update(unavailable_map(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.update(unavailable_map(v, f"{prefix}[{i}]"))
    return out


def looks_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name))


def env_snapshot(env: Mapping[str, str], prefixes: tuple[str, ...] = ENV_PREFIXES) -> dict[str, str]:
    """The NCCL_/CUDA_/TORCH_/PYTORCH_ variables; a secret-looking name or value becomes the REDACTED marker."""
    out = {}
    for name in sorted(env):
        if not name.startswith(prefixes):
            continue
        val = env[name]
        out[name] = REDACTED if looks_secret_name(name) or SECRET_VALUE_RE.search(val or "") else val
    return out


def _specific(v: str | None) -> bool:
    # Long or mixed enough that replacing it everywhere cannot mangle ordinary words ("enabled", "1").
    return bool(v) and (len(v) >= 16 or (len(v) >= 8 and not v.isalpha()))


def secret_values(env: Mapping[str, str], extra_names: tuple[str, ...] = ()) -> list[str]:
    """Values of every secret-looking variable (and of the named ones, e.g. the configured api_key_env)."""
    vals = {
        v
        for k, v in env.items()
        if _specific(v) and (looks_secret_name(k) or k in extra_names or SECRET_VALUE_RE.search(v))
    }
    return sorted(vals, key=len, reverse=True)


def scrub(obj: Any, secrets: list[str]) -> Any:
    """Replace every secret value (and credential-shaped text) inside every string of a nested object."""
    if isinstance(obj, str):
        for s in secrets:
            if s in obj:
                obj = obj.replace(s, REDACTED)
        return SECRET_VALUE_RE.sub(REDACTED, obj)
    if isinstance(obj, dict):
        return {k: scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, secrets) for v in obj]
    return obj
