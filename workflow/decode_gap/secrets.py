"""Keep secrets out of the report and the archive: the values of secret-looking environment variables
(and of the variable `api_key_env` names) are replaced wherever they appear, raw, HTML- or JSON-escaped."""

from __future__ import annotations

import html
import json
import os
import re
from typing import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
REDACTED = "[redacted]"
MIN_LEN = 8  # shorter values (flags like "1" or "true") are not secrets and would mangle the text


def secret_values(env: Mapping[str, str] | None = None, names: Iterable[str] = ()) -> list[str]:
    """Values to scrub: every env var whose name looks secret, plus the ones named explicitly."""
    env = os.environ if env is None else env
    wanted = {n for n in names if n}
    vals = {v for k, v in env.items() if v and len(v) >= MIN_LEN and (k in wanted or SECRET_NAME.search(k))}
    return sorted(vals, key=len, reverse=True)


def scrub_text(text: str, secrets: Iterable[str]) -> tuple[str, int]:
    """Replace each secret (raw, HTML-escaped, JSON-escaped) with [redacted]; returns the text and a count."""
    count = 0
    for value in secrets:
        for form in {value, html.escape(value), html.escape(value, quote=False), json.dumps(value)[1:-1]}:
            if form and form in text:
                count += text.count(form)
                text = text.replace(form, REDACTED)
    return text, count


def redact_url(url: str) -> str:
    """Drop user:password@ and secret-looking query parameters from a URL."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc.rsplit("@", 1)[-1] if "@" in parts.netloc else parts.netloc
    query = "&".join(
        q if not SECRET_NAME.search(q.split("=", 1)[0]) and q.split("=", 1)[0].lower() not in ("key", "sig")
        else f"{q.split('=', 1)[0]}={REDACTED}"
        for q in parts.query.split("&") if q
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# Credentials a server may echo in free text (its error messages): key=value pairs, bearer tokens, sk-/hf_ keys.
_CREDENTIALS = (
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}"),
    re.compile(r"""(?i)((?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|passwd|authorization)"""
               r"""["']?\s*[:=]\s*["']?)(?!(?:bearer|basic)\s)([^\s"',;}&)\]]+)"""),
    re.compile(r"\b(sk|pk|rk|hf|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{8,}"),
)


def scrub_credentials(text: str) -> str:
    """Credential-looking parts of free text replaced by the one marker, REDACTED."""
    text = _CREDENTIALS[0].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _CREDENTIALS[1].sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _CREDENTIALS[2].sub(REDACTED, text)
