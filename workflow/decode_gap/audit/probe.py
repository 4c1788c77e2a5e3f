"""How the audit reads a host: files under a root, tool calls, environment; a fake root and a tool runner
replay a captured host in tests (see collect.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Mapping

from . import parsers as P
from .fields import na, ok


class ToolUnavailable(Exception):
    """A tool is missing, failed, or timed out; the message is the one-line why."""


def run_command(argv: list[str], timeout: float = 20.0) -> str:
    """Run a system tool and return its stdout; raise ToolUnavailable with a one-line reason otherwise."""
    if not shutil.which(argv[0]):
        raise ToolUnavailable(f"{argv[0]} not on PATH")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ToolUnavailable(f"`{' '.join(argv)}` timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise ToolUnavailable(f"`{' '.join(argv)}`: {exc}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ToolUnavailable(f"`{' '.join(argv)}` exited {proc.returncode}: {msg[0] if msg else 'no output'}")
    return proc.stdout


class Probe:
    """Where the audit reads from: a filesystem root, a tool runner, the environment, NVML and torch switches."""

    def __init__(
        self,
        root: str | os.PathLike = "/",
        runner: Callable[[list[str]], str] = run_command,
        env: Mapping[str, str] | None = None,
        use_nvml: bool = True,
        use_torch: bool = True,
    ):
        self.root = Path(root)
        self.runner = runner
        self.env = dict(os.environ if env is None else env)
        self.use_nvml = use_nvml
        self.use_torch = use_torch
        self._tool_cache: dict[tuple[str, ...], str | ToolUnavailable] = {}

    @property
    def live(self) -> bool:
        """True when reading this host's own root (psutil, platform and uname then describe the same host)."""
        return self.root == Path("/")

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str:
        return self.path(rel).read_text(encoding="utf-8", errors="replace").strip()

    def read_bytes(self, rel: str) -> bytes:
        return self.path(rel).read_bytes()

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def tool(self, argv: list[str]) -> str:
        key = tuple(argv)
        if key not in self._tool_cache:
            try:
                self._tool_cache[key] = self.runner(argv)
            except ToolUnavailable as exc:
                self._tool_cache[key] = exc
        got = self._tool_cache[key]
        if isinstance(got, ToolUnavailable):
            raise got
        return got


def _file_field(probe: Probe, rel: str, convert: Callable[[str], Any] = lambda s: s) -> dict[str, Any]:
    try:
        text = probe.read(rel)
    except FileNotFoundError:
        return na(f"{rel} does not exist", rel)
    except OSError as exc:
        return na(f"{rel}: {exc.strerror or exc}", rel)
    try:
        return ok(convert(text), rel)
    except (ValueError, TypeError) as exc:
        return na(f"{rel}: cannot parse {text[:40]!r}: {exc}", rel)


def _tool_field(probe: Probe, argv: list[str], extract: Callable[[str], Any]) -> dict[str, Any]:
    source = " ".join(argv)
    try:
        text = probe.tool(argv)
    except ToolUnavailable as exc:
        return na(str(exc), source)
    try:
        got = extract(text)
    except (ValueError, KeyError, TypeError) as exc:
        return na(f"`{source}`: cannot parse: {exc}", source)
    return ok(got, source) if got is not None else na(f"`{source}` does not report it", source)


def _lscpu(probe: Probe, key: str) -> dict[str, Any]:
    return _tool_field(probe, ["lscpu"], lambda t: P.parse_lscpu(t)[key])
