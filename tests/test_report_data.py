"""Report data layer: tolerant loading, provenance labels, headline arithmetic, live ITL views, deltas, secrets.

Stage files come from tests/fixtures/report/ (synthetic fixtures written by make_fixtures.py, not measurements).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from decode_gap.report.data import (Fig, fmt_num, fmt_size, headline, load_bundle, load_doc, load_table, files_in_dir,
                                    num, parse_provenance)
from decode_gap.secrets import redact_url, scrub_text, secret_values
from decode_gap.report.sections import (chunk_itls, delta_row, findings_delta, itl_hist_frame, levers_list,
                                        timeline_frame, waterfall_frame, waterfall_hosts)

FIX = Path(__file__).resolve().parent / "fixtures" / "report"


def test_num_and_formatting():
    assert num(3) == 3.0 and num("2.5") == 2.5 and num({"value": 7, "status": "measured"}) == 7.0
    assert num(True) is None and num(float("nan")) is None and num("abc") is None and num(None) is None
    assert fmt_num(1.0) == "1" and fmt_num(4180.4) == "4,180" and fmt_num(39.31) == "39.3" and fmt_num(1.4237) == "1.42"
    assert fmt_num(0.0024) == "0.0024" and fmt_num(None) == "—"
    assert fmt_size(8) == "8 B" and fmt_size(32768) == "32 KiB" and fmt_size(64 * 2**20) == "64 MiB"
    assert parse_provenance("measured: copy bandwidth") == ("measured", "copy bandwidth")
    assert parse_provenance("unavailable: no GPU") == ("unavailable", "no GPU")
    assert parse_provenance("something else") == ("", "something else")


def test_fig_text_and_json_roundtrip():
    f = Fig(1.4237, "ms", "modelled", "roofline.json: t_floor_ms")
    assert f.ok and f.text() == "1.42 ms"
    assert Fig(3.0, "", "measured").text() == "3"
    assert Fig(3.61, "%", "modelled").text() == "3.61%"
    u = Fig(None, "ms", "unavailable", why="no GPU")
    assert not u.ok and u.text() == "unavailable"
    assert Fig.from_json(f.to_json()) == Fig(1.4237, "ms", "modelled", "roofline.json: t_floor_ms", "")
    assert Fig.from_json(u.to_json()).why == "no GPU"
    assert not Fig.from_json(None).ok


def test_load_doc_states(tmp_path):
    assert load_doc("audit", tmp_path / "nope.json").state == "missing"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    d = load_doc("audit", bad)
    assert d.state == "invalid" and "not valid JSON" in d.why and not d.usable
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    assert load_doc("audit", arr).state == "invalid"
    sk = tmp_path / "sk.json"
    sk.write_text(json.dumps({"stage": "live", "status": "skipped", "reason": "no server"}))
    d = load_doc("live", sk)
    assert d.state == "skipped" and d.why == "no server" and not d.usable
    part = tmp_path / "p.json"
    part.write_text(json.dumps({"status": "partial", "reason": "2 of 3 levels"}))
    assert load_doc("live", part).usable


def test_load_table_states(tmp_path):
    empty = tmp_path / "e.csv"
    empty.write_text("\n")
    assert not load_table("gemm", empty).usable and "no rows" in load_table("gemm", empty).why
    header_only = tmp_path / "h.csv"
    header_only.write_text("a,b\n")
    assert not load_table("gemm", header_only).usable
    junk = tmp_path / "j.parquet"
    junk.write_bytes(b"not parquet")
    t = load_table("live_chunks", junk)
    assert not t.usable and "cannot be read" in t.why
    ok = tmp_path / "ok.csv"
    pd.DataFrame({"size": [8, 16], "time_us": [5.0, 6.0]}).to_csv(ok, index=False)
    assert load_table("allreduce", ok).usable


def test_headline_from_fixture():
    figs = headline(load_bundle(files_in_dir(FIX / "h200x2")))
    gap = json.loads((FIX / "h200x2" / "gap.json").read_text())
    roof = json.loads((FIX / "h200x2" / "roofline.json").read_text())
    assert figs["roofline_ms"].value == pytest.approx(roof["t_floor_ms"]) and figs["roofline_ms"].status == "modelled"
    assert figs["live_itl_ms"].value == pytest.approx(gap["live_itl_ms"]) and figs["live_itl_ms"].status == "measured"
    assert figs["efficiency"].value == pytest.approx(gap["efficiency"] * 100) and figs["efficiency"].unit == "%"
    assert figs["gap_factor"].value == pytest.approx(gap["live_itl_ms"] / roof["t_floor_ms"])
    assert figs["live_tokens_per_s"].value == pytest.approx(1000 / gap["live_itl_ms"])
    assert figs["findings"].value == 3
    assert figs["peak_output_throughput"].status == "measured"


def test_headline_all_unavailable_for_stubs():
    figs = headline(load_bundle(files_in_dir(FIX / "stubbed")))
    assert all(not f.ok for f in figs.values())
    assert figs["roofline_ms"].why == "not implemented yet"


def test_headline_falls_back_to_live_summary_and_computes_efficiency(tmp_path):
    live = tmp_path / "live" / "summary.json"
    live.parent.mkdir()
    live.write_text(json.dumps({"status": "ok", "levels": [
        {"concurrency": 2, "median_itl_per_token_ms": 40.0},
        {"concurrency": 1, "median_itl_per_token_ms": 30.0, "median_ttft_ms": 50.0, "output_throughput": 33.0}]}))
    (tmp_path / "roofline.json").write_text(json.dumps({"status": "ok", "t_floor_ms": 3.0,
                                                        "provenance": {"t_floor_ms": "modelled: datasheet"}}))
    figs = headline(load_bundle(files_in_dir(tmp_path)))
    assert figs["live_itl_ms"].value == 30.0 and "concurrency=1" in figs["live_itl_ms"].source
    assert figs["efficiency"].value == pytest.approx(10.0) and figs["efficiency"].status == "modelled"
    assert figs["tokens_per_s_ceiling"].value == pytest.approx(1000 / 3.0)
    assert not figs["explained_fraction"].ok  # no gap.json: unavailable, with the reason
    assert "gap.json" in figs["explained_fraction"].why


def test_provenance_map_marks_field_unavailable(tmp_path):
    (tmp_path / "roofline.json").write_text(json.dumps({
        "status": "ok", "t_floor_ms": None, "t_comm_floor_ms": 0.5,
        "provenance": {"t_floor_ms": "unavailable: no bandwidth for cpu", "t_comm_floor_ms": "measured: allreduce.csv"}}))
    from decode_gap.report.data import fig_field

    doc = load_doc("roofline", tmp_path / "roofline.json")
    f = fig_field(doc, "t_floor_ms", "ms", "modelled")
    assert not f.ok and f.why == "no bandwidth for cpu"
    g = fig_field(doc, "t_comm_floor_ms", "ms", "modelled")
    assert g.ok and g.status == "measured"


def test_waterfall_orders_base_increments_residual_total():
    steps = [{"name": "roofline", "ms": 1.0, "source": "r", "status": "modelled"},
             {"name": "launch overhead", "ms": 2.0, "source": "s", "status": "measured"},
             {"name": "live ITL", "ms": 4.0, "source": "l", "status": "measured"},
             {"name": "unexplained residual", "ms": 1.0, "source": "x", "status": "modelled"}]
    df, ordered = waterfall_frame(steps)
    assert df["step"].tolist() == ["roofline", "launch overhead", "unexplained residual", "live ITL"]
    assert df["start"].tolist() == [0.0, 1.0, 3.0, 0.0] and df["end"].tolist() == [1.0, 3.0, 4.0, 4.0]
    assert df["kind"].tolist() == ["roofline / live", "measured", "residual", "roofline / live"]
    # a negative residual is drawn from its end back, and a missing ms is dropped, not a crash
    df2, _ = waterfall_frame([{"name": "roofline", "ms": 2.0}, {"name": "residual", "ms": -0.5},
                              {"name": "framework", "ms": None}, "garbage"])
    assert df2["start"].tolist() == [0.0, 1.5] and df2["end"].tolist() == [2.0, 2.0]


def test_waterfall_bars_mark_a_step_measured_on_another_device_than_most():
    on = {"h": "NVIDIA H200, rev h200-x", "c": "cpu: Intel(R) Xeon(R) Processor, rev h200-x", "g": "B200, rev b"}
    steps = [{"name": "roofline", "ms": 1.0, "kind": "start", "measured_on": on["h"]},
             {"name": "kernels", "ms": 2.0, "measured_on": on["h"]},
             {"name": "launch", "ms": 3.0, "measured_on": on["h"]},
             {"name": "HTTP/SSE", "ms": 0.1, "measured_on": on["c"]},
             {"name": "framework", "ms": None, "measured_on": "not recorded"},  # not drawn, no device
             {"name": "all-reduce", "ms": 0.0, "measured_on": "no host: modelled from the datasheet"},
             {"name": "live ITL", "ms": 6.1, "kind": "total", "measured_on": on["h"]}]
    df, _ = waterfall_frame(steps)
    labels = dict(zip(df["step"], df["label"]))
    assert (labels["kernels"], labels["HTTP/SSE"], labels["live ITL"]) == ("+2 ms", "+0.1 ms †", "6.10 ms")
    assert labels["all-reduce"] == "+0 ms"  # modelled, on no host: no mark
    assert waterfall_hosts(df) == "measured on H200; † on cpu: Intel(R) Xeon(R) Processor"
    two, _ = waterfall_frame(steps[:3] + [{"name": "x", "ms": 0.2, "measured_on": on["g"]}] + steps[3:])
    assert waterfall_hosts(two) == "measured on H200; † on B200; ‡ on cpu: Intel(R) Xeon(R) Processor"
    one, _ = waterfall_frame([{**st, "measured_on": on["c"]} for st in steps])
    assert not one["label"].str.contains("†").any()
    assert waterfall_hosts(one) == "measured on cpu: Intel(R) Xeon(R) Processor"
    assert waterfall_hosts(waterfall_frame([{"name": "roofline", "ms": 1.0}])[0]).startswith("where each step")


def test_levers_sorted_and_tolerant():
    from decode_gap.report.data import Doc

    doc = Doc("gap", "gap.json", None, {"levers": [
        {"name": "a", "ms_saved": 1.0, "evidence": "x"}, {"lever": "b", "saves_ms": 5.0},
        {"name": "c"}, "junk", {"name": "d", "ms": 2.5, "evidence": {"k": 1}}]}, "ok")
    out = levers_list(doc)
    assert [x["name"] for x in out] == ["b", "d", "a", "c"]
    assert out[0]["ms_text"] == "−5 ms" and out[-1]["ms_text"] == "saving not quantified"


def _chunks():
    # two requests; request 0 has a 3-token chunk (gap 30 ms) -> per chunk [10, 30], per token [10, 10, 10, 10]
    return pd.DataFrame({
        "request_id": [0, 0, 0, 1, 1],
        "concurrency": [1, 1, 1, 1, 1],
        "chunk_index": [0, 1, 2, 0, 1],
        "t_ms": [50.0, 60.0, 90.0, 40.0, 52.0],
        "tokens": [1, 1, 3, 1, 1],
    })


def test_chunk_itls_per_chunk_and_per_token():
    gaps, why = chunk_itls(_chunks(), 1)
    assert why == ""
    hist = itl_hist_frame(gaps, bins=4)
    per_chunk = hist[hist["view"] == "per chunk"]["count"].sum()
    per_token = hist[hist["view"] == "per token"]["count"].sum()
    assert per_chunk == 3 and per_token == 5  # gaps 10, 30, 12 -> tokens 1 + 3 + 1
    # nanosecond arrival times and no chunk index also work
    ns = _chunks().drop(columns=["chunk_index", "t_ms"]).assign(t_ns=[5e7, 6e7, 9e7, 4e7, 5.2e7])
    gaps2, _ = chunk_itls(ns, 1)
    assert sorted(gaps2["gap_ms"].dropna().round(6).tolist()) == [10.0, 12.0, 30.0]
    assert chunk_itls(_chunks().drop(columns=["request_id"]), 1)[0] is None
    assert "no chunk records" in chunk_itls(_chunks(), 8)[1]


def test_timeline_spreads_multi_token_chunk():
    tl, why, chosen = timeline_frame(_chunks(), None, 1)
    assert why == ""
    one = tl.sort_values("token")
    if chosen == "0":
        assert one["ms"].tolist() == [50.0, 10.0, 10.0, 10.0, 10.0]
        assert one["kind"].tolist()[-1] == "multi-token chunk"
    else:
        assert one["ms"].tolist() == [40.0, 12.0]


def test_delta_verdicts():
    r = delta_row("live_itl_ms", Fig(48.5, "ms", "measured"), Fig(39.3, "ms", "measured"))
    assert r["verdict"] == "better" and r["delta"].startswith("-9.2")
    r = delta_row("copy_gbps", Fig(4000, "GB/s", "measured"), Fig(3000, "GB/s", "measured"))
    assert r["verdict"] == "worse" and r["pct"] == "-25.0%"
    assert delta_row("live_itl_ms", Fig(10, "ms", "measured"), Fig(10.1, "ms", "measured"))["verdict"] == "same"
    r = delta_row("live_itl_ms", Fig(None, "ms", "unavailable"), Fig(10, "ms", "measured"))
    assert r["verdict"] == "changed" and r["delta"] == "now measured"


def test_findings_delta():
    before = [{"id": "gov", "severity": "warning"}, {"id": "numa", "severity": "warning"}, {"id": "pm", "severity": "info"}]
    after = [{"id": "numa", "severity": "warning"}, {"id": "pm", "severity": "warning"}, {"id": "mrr", "severity": "warning"}]
    ch = {r["id"]: r["change"] for r in findings_delta(before, after)}
    assert ch == {"gov": "resolved", "numa": "still present", "pm": "severity info → warning", "mrr": "new"}


def test_secrets_scrubbed_in_every_form():
    env = {"OPENAI_API_KEY": "sk-abc<def>&12345678", "PATH": "/usr/bin:/bin", "MY_KEY_VAR": "short", "X": "zzzzzzzzzz"}
    vals = secret_values(env, names=["X"])
    assert "sk-abc<def>&12345678" in vals and "zzzzzzzzzz" in vals and "/usr/bin:/bin" not in vals
    text = 'raw sk-abc<def>&12345678 html sk-abc&lt;def&gt;&amp;12345678 json "zzzzzzzzzz"'
    out, n = scrub_text(text, vals)
    assert "sk-abc" not in out and "zzzz" not in out and n == 3


def test_redact_url():
    assert redact_url("http://user:pw@127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    assert "s3cr3t" not in redact_url("http://127.0.0.1:8000/v1?api_key=s3cr3t&x=1")
    assert redact_url("") == ""


def test_levels_refused_by_the_gap_stage_are_not_shown_as_this_runs(tmp_path):
    """Issue 15: a CPU kernel level beside H200 levels is refused in gap.json; the headline says so, no 548 ms."""
    import shutil

    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    gap = json.loads((d / "gap.json").read_text())
    gap["refused_levels"] = {"kernel": "simulate/kernel.json was measured on cpu: AMD EPYC, the run's other levels "
                                       "on NVIDIA H200"}
    (d / "gap.json").write_text(json.dumps(gap))
    figs = headline(load_bundle(files_in_dir(d)))
    for key in ("kernel_eager_ms", "kernel_graph_ms"):
        assert not figs[key].ok and "cpu: AMD EPYC" in figs[key].why
    assert figs["engine_eager_ms"].ok


def test_measured_elsewhere_only_for_a_device_this_host_lacks(tmp_path):
    from decode_gap.report.copied import measured_elsewhere

    d = tmp_path / "h200-rev"
    d.mkdir()
    assert measured_elsewhere(d, ["cpu: AMD EPYC"]) == ""  # no gap.json yet: a fresh tree
    (d / "gap.json").write_text(json.dumps({"measured_on": {"run": {"device": "NVIDIA H200"}}}))
    assert measured_elsewhere(d, ["NVIDIA H200", "cpu: Intel Xeon"]) == ""
    why = measured_elsewhere(d, ["cpu: AMD EPYC"])
    assert "was measured on NVIDIA H200" in why and "hardware_revision=h200-rev" in why


def test_a_cpu_run_labels_its_floor_and_its_stand_in_kernel_level():
    """A CPU run (the captured cpu-real stage files): no datasheet bandwidth, so the floor is the gap's, at the
    measured bandwidth, and the headline says so; the kernel level ran fp32 stand-ins for a GGUF file, so its step is
    marked as such and no framework overhead (engine minus kernel) is computed from it."""
    from decode_gap.report.sections import Builder, headline_section, simulation_section

    bundle = load_bundle(files_in_dir(FIX / "cpu-real"))
    figs = headline(bundle)
    h = headline_section(Builder(), bundle, figs)
    assert h["floor_label"] == "Floor at measured bandwidth" and "measured bandwidth" in h["summary"]
    assert "stand-in" in h["kernel_stand_in"]
    s = simulation_section(Builder(), bundle, figs)
    assert figs["engine_eager_ms"].ok and figs["kernel_eager_ms"].ok
    assert s["framework_overhead"] is None and "stand-in weights" in s["framework_overhead_why"]
    assert "stand-in" in s["kernel_stand_in"] and s["components_clock"] == "eager"


def test_a_run_with_a_datasheet_floor_and_the_run_s_weights_computes_the_framework_overhead():
    from decode_gap.report.sections import Builder, headline_section, simulation_section

    bundle = load_bundle(files_in_dir(FIX / "h200x2"))
    figs = headline(bundle)
    h = headline_section(Builder(), bundle, figs)
    assert h["floor_label"] == "Theoretical floor" and not h["kernel_stand_in"]
    s = simulation_section(Builder(), bundle, figs)
    assert s["framework_overhead"] == pytest.approx(figs["engine_eager_ms"].value - figs["kernel_eager_ms"].value)
    assert not s["framework_overhead_why"] and not s["kernel_stand_in"]


def test_a_single_rank_all_reduce_says_it_measures_the_call_alone(tmp_path):
    import shutil

    from decode_gap.report.sections import Builder, allreduce_sub

    d = tmp_path / "run"
    shutil.copytree(FIX / "cpu-real", d)
    doc = json.loads((d / "microbench" / "allreduce.json").read_text())
    doc["world_size"] = 1
    (d / "microbench" / "allreduce.json").write_text(json.dumps(doc))
    note = allreduce_sub(Builder(), load_bundle(files_in_dir(d)))["single_rank_note"]
    assert "no byte crosses a link" in note and "The model at tp=1 runs no all-reduce" in note
    roof = json.loads((d / "roofline.json").read_text())
    (d / "roofline.json").write_text(json.dumps({**roof, "tp": 8}))  # one GPU standing for TP8
    note = allreduce_sub(Builder(), load_bundle(files_in_dir(d)))["single_rank_note"]
    assert "tp=1" not in note and "the gap's all-reduce step counts these calls: a floor" in note  # an older gap.json
    gap = json.loads((d / "gap.json").read_text())
    next(w for w in gap["waterfall"] if w["name"] == "all-reduce")["one_rank"] = True
    (d / "gap.json").write_text(json.dumps(gap))
    note = allreduce_sub(Builder(), load_bundle(files_in_dir(d)))["single_rank_note"]
    assert "The model runs at tp=8: the gap counts the roofline's datasheet all-reduces instead." in note
    doc["world_size"] = 2
    (d / "microbench" / "allreduce.json").write_text(json.dumps(doc))
    assert "single_rank_note" not in allreduce_sub(Builder(), load_bundle(files_in_dir(d)))


def test_the_sweep_tells_a_queueing_server_from_a_batching_one():
    from decode_gap.report.sections.live import concurrency_reading

    def level(c, tput, ttft, itl):
        return {"concurrency": c, "output_throughput": tput, "median_ttft_ms": ttft, "median_itl_per_token_ms": itl}

    # the CPU run's embedded llama.cpp server: throughput flat, TTFT x26, ITL flat -> one request at a time
    queued = concurrency_reading([level(1, 35.5, 171, 17.3), level(2, 44.8, 1578, 18.3), level(4, 40.9, 4393, 19.0)])
    assert "×1.15 (×4 if" in queued and "one after another" in queued and "171 → 4,393 ms" in queued
    # a batching server: 3.3x the throughput at 4 streams, the ITL paying 20%
    batched = concurrency_reading([level(1, 25.0, 40, 39.3), level(4, 83.5, 45, 47.2)])
    assert "78% of linear scaling" in batched and "one after another" not in batched
    assert concurrency_reading([level(1, 25.0, 40, 39.3)]) == ""  # one level: nothing to compare


def test_a_cpu_run_s_roofline_counts_bytes_per_cpu_not_per_gpu():
    from decode_gap.report.sections import Builder, roofline_section

    cpu = roofline_section(Builder(), load_bundle(files_in_dir(FIX / "cpu-real")))
    assert [label for label, _ in cpu["figs"][:3]] == ["Weight bytes / token / CPU", "KV-cache bytes / token / CPU",
                                                      "Total bytes / token / CPU"]
    gpu = roofline_section(Builder(), load_bundle(files_in_dir(FIX / "h200x2")))
    assert gpu["figs"][0][0] == "Weight bytes / token / GPU"


def test_the_server_s_identity_reads_as_sizes_seconds_and_text_not_json():
    from decode_gap.report.sections.live import _server_value

    assert _server_value("gguf_bytes", 253113024) == "253 MB"
    assert _server_value("startup_s", 1.1591135570015467) == "1.16 s"
    assert _server_value("models", ["resources/models/gemma.gguf"]) == "resources/models/gemma.gguf"
    assert _server_value("headers", {"server": "uvicorn", "vary": "Origin"}) == "server: uvicorn; vary: Origin"
    assert _server_value("threads", 2) == "2" and _server_value("interrupt", False) == "false"


def test_a_few_requests_a_level_say_their_p99_is_about_their_max():
    from decode_gap.report.sections import Builder, live_section

    s = live_section(Builder(), load_bundle(files_in_dir(FIX / "cpu-real")))
    assert s["thin_tail"].startswith("TTFT and E2E latency have one sample a request: at ")
    assert "live.num_requests" in s["thin_tail"]


def test_the_kernel_table_says_when_the_gap_counts_the_datasheet_s_all_reduces(tmp_path):
    import shutil

    from decode_gap.report.sections import Builder, simulation_section

    d = tmp_path / "run"
    shutil.copytree(FIX / "h200x2", d)
    gap = json.loads((d / "gap.json").read_text())
    step = next(w for w in gap["waterfall"] if w["name"] == "all-reduce")
    step.update(ms=1.055, note="the all-reduce was measured at 1 rank, not tp=8: a call that moves no byte",
                one_rank=True)
    (d / "gap.json").write_text(json.dumps(gap))
    bundle = load_bundle(files_in_dir(d))
    notes = simulation_section(Builder(), bundle, headline(bundle))["kernel_notes"]
    assert notes[-1].startswith("The gap counts the all-reduces at 1.05 ms, not this table's: the all-reduce was")


def test_closure_without_a_live_itl_is_not_checked_rather_than_failed(tmp_path):
    """gap.json's closure_pass is False where there is no closure ratio (no live ITL); the report says nothing of
    closure then, and keeps "fails" for a ratio outside the band."""
    from decode_gap.report.sections import Builder, simulation_section

    for ratio, want in ((None, None), (0.5, False)):
        d = tmp_path / f"r{ratio}"
        d.mkdir()
        (d / "gap.json").write_text(json.dumps({"status": "partial", "waterfall": [], "headline": {
            "closure_ratio": ratio, "closure_pass": False}}))
        bundle = load_bundle(files_in_dir(d))
        assert simulation_section(Builder(), bundle, headline(bundle))["closure_pass"] is want, ratio


def test_without_a_live_itl_the_headline_says_what_the_kernels_alone_take(tmp_path):
    """No live ITL (stages.live false): the headline gives the floor and, since the kernel level ran the run's
    weights on its GPU, the kernels' step in one CUDA graph as a multiple of that floor."""
    import shutil

    from decode_gap.report.sections import Builder, headline_section

    d = tmp_path / "h200x2"
    shutil.copytree(FIX / "h200x2", d)
    (d / "live" / "summary.json").write_text(json.dumps({"stage": "live", "status": "skipped", "levels": [],
                                                         "reason": "stages.live is false in the config"}))
    gap = json.loads((d / "gap.json").read_text())
    gap["live_itl_ms"] = None
    (d / "gap.json").write_text(json.dumps(gap))
    bundle = load_bundle(files_in_dir(d))
    figs = headline(bundle)
    summary = headline_section(Builder(), bundle, figs)["summary"]
    assert "the live decode latency was not measured" in summary
    ratio = figs["kernel_graph_ms"].value / figs["roofline_ms"].value
    assert f"The kernels alone take {figs['kernel_graph_ms'].text()} a step in one CUDA graph, {ratio:.1f}×" in summary
