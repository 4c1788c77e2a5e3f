"""Core helpers that stages use instead of each other's code: reading a stage file, a figure's value, prompts."""

import json

from decode_gap.errors import describe
from decode_gap.io import read_stage_json
from decode_gap.prompts import WORDS, random_words
from decode_gap.provenance import figure_value, measured, unavailable


def test_read_stage_json_says_why_not(tmp_path):
    assert read_stage_json(None) == (None, "not an input of this run")
    assert read_stage_json(tmp_path / "a.json") == (None, "a.json is missing")
    (tmp_path / "b.json").write_text("{not json")
    assert read_stage_json(tmp_path / "b.json") == (None, "b.json is unreadable (JSONDecodeError)")
    (tmp_path / "c.json").write_text("[1]")
    assert read_stage_json(tmp_path / "c.json") == (None, "c.json is not a JSON object")
    (tmp_path / "d.json").write_text(json.dumps({"status": "skipped", "reason": "no GPU"}))
    assert read_stage_json(tmp_path / "d.json") == (None, "d.json: skipped (no GPU)")
    (tmp_path / "e.json").write_text(json.dumps({"status": "ok", "x": 1}))
    assert read_stage_json(tmp_path / "e.json") == ({"status": "ok", "x": 1}, "")


def test_figure_value_reads_numbers_and_labelled_figures():
    assert figure_value(2) == 2.0 and figure_value(measured(3.5, "us", "x")) == 3.5
    assert figure_value(unavailable("no GPU")) is None
    assert figure_value(True) is None and figure_value("1") is None and figure_value(float("nan")) is None


def test_describe_puts_a_caught_exception_on_one_short_line_without_credentials():
    assert describe(ValueError("bad shape\n  at line 2")) == "ValueError: bad shape"
    assert describe(RuntimeError("")) == "RuntimeError" == describe(RuntimeError("  \n"))
    assert describe(OSError("x" * 500), 10) == "OSError: " + "x" * 10
    assert describe(KeyError("gone"), with_type=False) == "'gone'"
    assert describe(TimeoutError(), with_type=False) == "TimeoutError"  # never an empty reason
    compile_error = RuntimeError("at 53:27:\n    acc0 = _loop(wb, sb)\n           ^\n"
                                 "AttributeError(\"'str' object\")\n")
    assert describe(compile_error) == "RuntimeError: at 53:27: AttributeError(\"'str' object\")"
    line = describe(ConnectionError("GET http://h/v1?api_key=sk-abcdefghijkl failed: Bearer abc.def.ghi"))
    assert "sk-abcdefghijkl" not in line and "abc.def.ghi" not in line and "[redacted]" in line


def test_random_words_is_seeded():
    assert random_words(5, 1) == random_words(5, 1) != random_words(5, 2)
    assert len(random_words(0, 3).split()) == 1 and set(random_words(50, 4).split()) <= set(WORDS)


def test_the_failed_jobs_of_this_run_are_read_from_their_logs(tmp_path):
    import os
    import time

    from decode_gap.smk import ERROR_PREFIX, failed_job_lines

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "measure_live.log").write_text(f"requests...\n{ERROR_PREFIX}measure_live: cannot connect to http://h:1/v1\n")
    (logs / "bench_gemm.log").write_text("all fine\n")
    old = logs / "bench_moe.log"
    old.write_text(f"{ERROR_PREFIX}bench_moe: an earlier run's failure\n")
    start = time.time() - 1
    os.utime(old, (start - 60, start - 60))
    assert failed_job_lines([logs, tmp_path / "missing"], start) == [
        f"{ERROR_PREFIX}measure_live: cannot connect to http://h:1/v1"]
