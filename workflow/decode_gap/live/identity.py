"""Who is serving: `/v1/models`, response headers and version endpoints, and the engine they point to.

Only GET requests are sent for identity. Every stored value is clipped to a short one-line string, and keys
that look like credentials (key, token, secret, password, auth, cookie) are dropped, so a server that
echoes its own settings (SGLang's `/get_server_info` lists `api_key`) cannot leak a secret into a result.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from ..errors import REASON_CHARS, describe
from .client import display_url, one_line

ENGINES = ("llama.cpp", "transformers", "sglang", "vllm", "tgi", "other", "unknown")
SENSITIVE = re.compile(r"key|token|secret|passw|auth|cookie|credential|session", re.I)
VERSION_PATHS = ("/version", "/info", "/props", "/get_server_info", "/server_info", "/health")
_DROP_HEADERS = {"date", "content-length", "transfer-encoding", "connection", "keep-alive"}


def server_root(endpoint: str) -> str:
    """`http://host:port/v1` -> `http://host:port` (version endpoints live at the root)."""
    root = endpoint.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def clip(obj: Any, depth: int = 0) -> Any:
    """A short, secret-free copy of server-supplied JSON."""
    if isinstance(obj, dict):
        if depth >= 2:
            return f"{{{len(obj)} keys}}"
        out = {}
        for k, v in list(obj.items())[:40]:
            if SENSITIVE.search(str(k)):
                continue
            out[one_line(str(k), 60)] = clip(v, depth + 1)
        return out
    if isinstance(obj, list):
        if depth >= 2:
            return f"[{len(obj)} items]"
        return [clip(v, depth + 1) for v in obj[:10]]
    if isinstance(obj, str):
        return one_line(obj, 200)
    if obj is None or isinstance(obj, (bool, int, float)):
        return obj
    return one_line(str(obj), 200)


def safe_headers(headers: dict[str, str] | httpx.Headers) -> dict[str, str]:
    out = {}
    for k, v in dict(headers).items():
        k = k.lower()
        if k in _DROP_HEADERS or SENSITIVE.search(k) or k in ("x-request-id", "request-id"):
            continue
        out[k] = one_line(v, 200)
    return out


async def _get_json(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[int | None, Any, dict]:
    try:
        resp = await client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        return None, describe(exc, REASON_CHARS), {}
    try:
        body: Any = resp.json()
    except ValueError:
        body = one_line(resp.text, 200) if resp.text else ""
    return resp.status_code, body, dict(resp.headers)


async def probe_identity(client: httpx.AsyncClient, endpoint: str, headers: dict[str, str]) -> dict[str, Any]:
    """`{endpoint, models, owned_by, models_status, headers, endpoints}` from GET requests only.

    The runner adds `stream_headers`, the headers of the first streamed answer."""
    root = server_root(endpoint)
    out: dict[str, Any] = {"endpoint": display_url(endpoint), "models": [], "owned_by": [], "headers": {}, "endpoints": {}}
    status, body, hdrs = await _get_json(client, endpoint.rstrip("/") + "/models", headers)
    out["models_status"] = status if status is not None else body
    if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
        for entry in body["data"][:20]:
            if isinstance(entry, dict) and entry.get("id") is not None:
                out["models"].append(one_line(str(entry["id"]), 200))
                out["owned_by"].append(one_line(str(entry.get("owned_by", "")), 60))
    out["headers"] = safe_headers(hdrs)
    for path in VERSION_PATHS:
        st, b, _ = await _get_json(client, root + path, headers)
        if st == 200:
            out["endpoints"][path] = clip(b)
    return out


def detect_engine(identity: dict[str, Any], configured: str = "auto", embedded: bool = False) -> tuple[str, str, str | None]:
    """(engine, evidence, engine version or None) from config, the embedded server, or the identity."""
    eps = identity.get("endpoints", {}) or {}
    if configured and configured != "auto":
        return configured, "config live.engine", None
    if embedded:
        return "llama.cpp", "embedded llama-cpp-python server", identity.get("version")
    server_hdr = " ".join(str((identity.get(k) or {}).get("server", "")) for k in ("headers", "stream_headers")).lower()
    owners = [str(o).lower() for o in identity.get("owned_by", [])]
    if "llama.cpp" in server_hdr:
        return "llama.cpp", "response header server: llama.cpp", None
    for owner, engine in (("vllm", "vllm"), ("sglang", "sglang"), ("llamacpp", "llama.cpp"), ("tgi", "tgi")):
        if owner in owners:
            version = None
            if engine == "vllm" and isinstance(eps.get("/version"), dict):
                version = eps["/version"].get("version")
            return engine, f"/v1/models owned_by={owner}", version
    info = eps.get("/info")
    if isinstance(info, dict) and "model_id" in info and ("docker_label" in info or "sha" in info or "version" in info):
        return "tgi", "/info (text-generation-inference)", info.get("version")
    for path in ("/get_server_info", "/server_info"):
        if isinstance(eps.get(path), dict):
            return "sglang", path, eps[path].get("version")
    props = eps.get("/props")
    if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
        return "llama.cpp", "/props (llama.cpp server)", props.get("build_info")
    if "me" in owners:
        return "llama.cpp", "/v1/models owned_by=me (llama-cpp-python)", None
    version = eps.get("/version")
    if isinstance(version, dict) and set(version) == {"version"}:
        return "vllm", "/version", version.get("version")
    return "unknown", "no engine signature in /v1/models, headers or version endpoints; set live.engine", None
