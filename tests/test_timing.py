"""The core timing module: one spread, one flusher, clocks in microseconds."""

import os

import pytest

from decode_gap import timing
from decode_gap.simulate import timing as sim_timing


def test_spread_names_its_unit_and_uses_numpy_percentiles():
    s = timing.spread([1.0, 2.0, 3.0, 4.0], "ms")
    assert list(s) == ["n", "min_ms", "median_ms", "mean_ms", "p99_ms", "max_ms"]
    assert s["n"] == 4 and s["median_ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 4.0
    assert s["p99_ms"] == pytest.approx(3.97)
    assert timing.spread([], "us") == {"n": 0, "min_us": None, "median_us": None, "mean_us": None,
                                       "p99_us": None, "max_us": None}
    assert timing.spread([1000.0], "ms", scale=1e-3)["median_ms"] == 1.0


def test_simulate_keeps_milliseconds_over_the_core_clock():
    calls = []
    us = timing.time_cpu_us(lambda: calls.append(1), warmup=2, iters=3, before=lambda: calls.append(0))
    assert len(us) == 3 and calls == [1, 1, 0, 1, 0, 1, 0, 1]
    ms = sim_timing.time_cpu(lambda: None, warmup=0, iters=2)
    assert len(ms) == 2 and all(t >= 0 for t in ms)
    assert sim_timing.spread([2.0])["median_ms"] == 2.0


def test_flusher_is_a_no_op_on_a_cpu_device():
    f = timing.L2Flusher("cpu")
    assert f.buf is None
    f()
    assert timing.l2_bytes("cpu") == 0


def test_a_cpu_s_caches_are_flushed_with_a_write_over_4x_its_last_level(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    for index, (level, size) in enumerate([(1, "48K"), (2, "1024K"), (3, "32768K"), (1, "32K")]):
        (cache / f"index{index}").mkdir(parents=True)
        (cache / f"index{index}" / "level").write_text(f"{level}\n")
        (cache / f"index{index}" / "size").write_text(f"{size}\n")
    real_path = timing.Path
    monkeypatch.setattr(timing, "Path", lambda p: cache if str(p).endswith("cpu0/cache") else real_path(p))
    assert timing.llc_bytes() == 32 * 2**20
    f = timing.CpuCacheFlusher()
    assert f.nbytes == 128 * 2**20 and f.buf.numel() == f.nbytes
    f()
    assert int(f.buf[::4096].min()) == 1  # written, not just allocated
    (cache / "index2" / "size").write_text("512K\n")  # a small cache: 64 MiB at least
    assert timing.CpuCacheFlusher().nbytes == 64 * 2**20
    monkeypatch.setattr(timing, "Path", lambda p: tmp_path / "none" if str(p).endswith("cpu0/cache") else real_path(p))
    assert timing.llc_bytes() is None and timing.CpuCacheFlusher().nbytes == timing.FLUSH_MIN_BYTES


def test_the_micro_benchmarks_cpu_clock_flushes_before_each_timed_call():
    from decode_gap.microbench import timing as mb_timing

    calls = []
    t = mb_timing.measure([lambda: calls.append("call")], "cpu", warmup=1, iters=3, flush=lambda: calls.append("flush"))
    assert calls == ["call", "flush", "call", "flush", "call", "flush", "call"]
    assert t.method == mb_timing.CPU_WALL == "cpu-perf_counter-llcflush" and t.eager.n == 3


class _FakeCudaDouble:
    """Test double for torch.cuda's events (no GPU here): an event records the step at which it was recorded,
    and elapsed_time is the step difference in ms, so the order of calls is what gets measured."""

    def __init__(self, log):
        log_ref = log

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                log_ref.append("record")
                self.t = len(log_ref)

            def elapsed_time(self, other):
                return float(other.t - self.t)

        class Cuda:
            pass

        self.cuda = Cuda()
        self.cuda.Event = Event
        self.cuda.synchronize = lambda device=None: log_ref.append("sync")


def test_back_to_back_us_brackets_each_call_and_syncs_once(monkeypatch):
    import decode_gap.timing as core

    log: list[str] = []
    monkeypatch.setattr(core, "_torch", lambda: _FakeCudaDouble(log))
    out = core.back_to_back_us(lambda: log.append("call"), 3, "cuda:0", before_each=lambda: log.append("flush"))
    assert log == ["flush", "record", "call", "record"] * 3 + ["sync"]
    assert out == [2000.0, 2000.0, 2000.0]  # start..end spans the call only (the flush is outside): 2 steps -> µs


def test_graph_spans_us_queues_a_sleep_ahead_of_each_replay(monkeypatch):
    """The calibration clock: sync, a sleep kernel, then the event pair around the replay only, for each replay."""
    import decode_gap.timing as core

    log: list[str] = []
    double = _FakeCudaDouble(log)
    double.cuda._sleep = lambda cycles: log.append(f"sleep {cycles}")
    monkeypatch.setattr(core, "_torch", lambda: double)

    class Graph:
        def replay(self):
            log.append("replay")

    out = core.graph_spans_us(Graph(), 2, 100)
    assert log == ["sync", "sleep 100", "record", "replay", "record"] * 2 + ["sync"]
    assert out == [2000.0, 2000.0]


def test_measuring_rules_take_turns_on_the_host_lock(tmp_path, monkeypatch):
    """A second measurement waits while another process holds the host's lock, and says so in its log."""
    import subprocess
    import sys
    import textwrap

    lock = tmp_path / "measure.lock"
    monkeypatch.setenv(timing.MEASURE_LOCK_ENV, str(lock))
    assert timing.measure_lock_path() == lock
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from filelock import FileLock
        with FileLock({str(lock)!r}):
            print("held", flush=True)
            time.sleep(1.0)
        """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lines = []
    with timing.exclusive_measurement("rule bench_gemm", log=lines.append) as waited:
        assert waited > 0.3
    holder.wait(timeout=30)
    assert "rule bench_gemm waits for the host's measurement lock" in lines[0] and str(lock) in lines[0]
    assert "waited" in lines[1]
    lines.clear()
    with timing.exclusive_measurement("rule bench_moe", log=lines.append) as waited:  # free: no wait, no line
        assert waited < 0.1
    assert lines == []


def test_clock_watch_is_empty_on_a_cpu_host():
    with timing.ClockWatch("cpu") as w:
        pass
    assert w.columns() == {"clock_capped_frac": None, "clock_capped_by": "", "sm_clock_mhz": None}


def test_clock_watch_reads_the_share_of_time_under_the_power_cap(monkeypatch):
    """NVML replaced by a test double (no GPU here): 30 ms of power-cap violation over the watched interval."""
    import types

    import pynvml

    counters = {pynvml.NVML_PERF_POLICY_POWER: 0, pynvml.NVML_PERF_POLICY_THERMAL: 0}
    monkeypatch.setattr(timing, "_nvml_handle", lambda device: "gpu0")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetViolationStatus",
                        lambda h, policy: types.SimpleNamespace(violationTime=counters[policy]))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", lambda h, kind: 1740)
    clock = iter([0, 100_000_000])  # the watch's wall clock, ns: 100 ms
    w = timing.ClockWatch("cuda", clock=lambda: next(clock)).start()
    counters[pynvml.NVML_PERF_POLICY_POWER] = 30_000_000
    w.stop()
    assert w.columns() == {"clock_capped_frac": pytest.approx(0.3), "clock_capped_by": "power", "sm_clock_mhz": 1740}


def test_a_lock_file_of_another_user_falls_back_to_a_per_user_lock(tmp_path, monkeypatch):
    """A FileLock test double refuses the shared path, as another user's 0644 lock file would (root is never
    refused, so the real case cannot be made here)."""
    shared = tmp_path / "measure.lock"
    monkeypatch.setenv(timing.MEASURE_LOCK_ENV, str(shared))
    taken = []

    class RefusingLock:
        def __init__(self, path, mode=0o644):
            self.lock_file = path

        def acquire(self, timeout=-1):
            if self.lock_file == str(shared):
                raise PermissionError(13, "Permission denied", self.lock_file)
            taken.append(self.lock_file)

        def release(self):
            pass

    monkeypatch.setattr(timing, "FileLock", RefusingLock)
    lines = []
    with timing.exclusive_measurement("rule bench_moe", log=lines.append):
        pass
    assert taken and taken[0].endswith(f"measure-{os.getuid()}.lock")
    assert "another user's" in lines[0]


def test_rotated_times_each_form_first_once_a_round_in_turn():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = timing.rotated(lambda fn: [float(len(calls)), float(fn() or len(calls))], fns, rounds=3)
    assert calls == list("abcbcacab")  # every form once in each place of the order
    assert {name: len(s) for name, s in samples.items()} == {"a": 6, "b": 6, "c": 6}
