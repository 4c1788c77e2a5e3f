"""The one way a stage starts several ranks on this host: fresh interpreters running an importable module.

Snakemake's `script:` directive injects the `snakemake` object into the script's `__main__` only. A rank started
with multiprocessing's spawn (torch.multiprocessing.spawn included) re-imports that `__main__` and dies with
`NameError: name 'snakemake' is not defined`. So every rank here is `python -m <module> <job.json> <rank>`: the
module's `__main__` calls `rank_main(body)`, which reads the job and runs `body(rank, job)`. Nothing of the
caller's `__main__` is re-run, whoever the caller is (a Snakemake script, pytest, a benchmark).

The launcher watches every rank: at the first failure it stops the others and raises one line naming the rank
and its last error line; a rank still running at the deadline is stopped the same way. No process outlives the
call. Ranks meet through a file store in the job's private directory (no port to race for).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .errors import DecodeGapError

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate every rank still running, then kill what is left after a grace period."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def last_error_line(log_path: Path) -> str:
    """The exception line of a rank's log (or its last line): what the one-line error quotes."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception|Interrupt|Exit)\b", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # The package of this checkout, first, whatever the caller's sys.path trick was.
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def launch(module: str, job: dict[str, Any], world_size: int, timeout_s: float, what: str,
           payload: Any = None, env: dict[str, str] | None = None,
           log_sink: Callable[[int, str], None] | None = None) -> dict[int, Any]:
    """Run `python -m module job.json rank` for every rank; return {rank: the JSON it wrote with `write_result`}.

    `job` must be JSON-serialisable; `payload` (optional, any picklable object, e.g. a model spec) travels
    beside it and is read back with `load_payload(job)`. `what` names the stage in errors. Each rank's log is
    passed to `log_sink(rank, text)` (default: printed, so it lands in the rule's log).
    """
    with tempfile.TemporaryDirectory(prefix=f"decode-gap-{what.replace(' ', '-')}-") as tmp:
        job = {**job, "out_dir": tmp, "init_method": f"file://{tmp}/store", "world_size": world_size}
        if payload is not None:
            job["payload_path"] = str(Path(tmp, "payload.pkl"))
            Path(job["payload_path"]).write_bytes(pickle.dumps(payload))
        job_path = Path(tmp, "job.json")
        job_path.write_text(json.dumps(job))
        child_env = _child_env(env)
        procs: list[subprocess.Popen] = []
        logs = []
        try:
            for r in range(world_size):
                log = open(Path(tmp, f"rank{r}.log"), "w")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, "-m", module, str(job_path), str(r)],
                                              stdout=log, stderr=subprocess.STDOUT, env=child_env))
            deadline = time.time() + timeout_s
            while True:
                codes = [p.poll() for p in procs]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    r = failed[0]
                    _stop_all(procs)
                    raise DecodeGapError(
                        f"{what}: rank {r} of {world_size} failed ({exit_text(codes[r])}): "
                        f"{last_error_line(Path(tmp, f'rank{r}.log'))}; the other ranks were stopped"
                    )
                if all(c == 0 for c in codes):
                    break
                if time.time() > deadline:
                    alive = [r for r, c in enumerate(codes) if c is None]
                    _stop_all(procs)
                    raise DecodeGapError(
                        f"{what}: rank(s) {', '.join(map(str, alive))} of {world_size} did not finish within "
                        f"{timeout_s:.0f} s; every rank was stopped"
                    )
                time.sleep(0.1)
        finally:
            _stop_all(procs)
            for r, log in enumerate(logs):
                log.close()
                text = Path(tmp, f"rank{r}.log").read_text(errors="replace")
                if text.strip():
                    (log_sink or _print_log)(r, text)
        out: dict[int, Any] = {}
        for r in range(world_size):
            path = Path(tmp, f"rank{r}.json")
            if path.exists():
                out[r] = json.loads(path.read_text())
        return out


def _print_log(rank: int, text: str) -> None:
    print(f"--- rank {rank} ---\n{text.rstrip()}", flush=True)


def load_payload(job: dict[str, Any]) -> Any:
    return pickle.loads(Path(job["payload_path"]).read_bytes()) if job.get("payload_path") else None


def write_result(job: dict[str, Any], rank: int, result: Any) -> None:
    """What `launch` returns for this rank (JSON)."""
    Path(job["out_dir"], f"rank{rank}.json").write_text(json.dumps(result))


def rank_main(body: Callable[[int, dict[str, Any]], None], argv: list[str] | None = None) -> int:
    """A rank module's `__main__`: `python -m module <job.json> [rank]` (or $RANK under torchrun)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m <module> <job.json> [rank]", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    if len(argv) > 1:
        rank = int(argv[1])
    elif os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
    else:
        print(f"{argv[0]}: no rank argument and $RANK is not set (start it with torchrun)", file=sys.stderr)
        return 2
    body(rank, job)
    return 0
