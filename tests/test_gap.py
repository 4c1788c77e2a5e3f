"""Gap attribution arithmetic: the waterfall sums exactly to the live ITL, a negative residual is flagged,
missing inputs become 'unavailable' rows, the levers are ranked by the milliseconds they save."""

import math

import pytest

from decode_gap.gap import attribute, attribute_files, load_input
from decode_gap.io import write_json


def gpu_inputs(**over):
    inputs = {
        "roofline": {"tp": 1, "t_memory_ms": 0.45, "bytes_per_token_per_gpu": 2.16e9,
                     "hardware": {"memory_bandwidth_gbps": 4800}, "allreduces_per_token": 0, "t_comm_floor_ms": 0.0},
        "memory": {"read_gbps": 4000.0, "copy_gbps": 4300.0},
        "simulate": {
            "kernel": {"status": "ok", "format_match": True, "eager_ms": 6.0, "graph_ms": 0.9, "tp": 1,
                       "layers_simulated": 16, "layers_total": 16, "components": []},
            "engine": {"status": "ok", "engine": "transformers", "eager_ms": 15.0, "graph_ms": 2.0, "serving_ms": 15.0,
                       "loop": {"overhead_ms": 0.0}, "cpu_saturated": False},
            "server": {"status": "ok", "stack": "starlette", "server_cpu_per_chunk_ms": 0.25,
                       "client_cpu_per_chunk_ms": 0.05},
        },
        "live": {"status": "ok", "engine": "transformers",
                 "levels": [{"concurrency": 2, "completed": 8, "median_itl_per_token_ms": 30.0},
                            {"concurrency": 1, "completed": 8, "median_itl_per_token_ms": 16.0}]},
        "audit": {"findings": [{"id": "pcie.max_read_req", "severity": "warning", "title": "MaxReadReq 512->4096",
                                "evidence": "MaxReadReq 512 bytes on GPU0", "fix": "setpci ..."},
                               {"id": "x", "severity": "info", "title": "fine", "evidence": "", "fix": ""}]},
    }
    inputs.update(over)
    return inputs


def steps(g):
    return {r["name"]: r for r in g["waterfall"]}


def test_gpu_waterfall_sums_exactly_and_ranks_levers():
    g = attribute(gpu_inputs())
    w = steps(g)
    assert g["status"] == "ok"
    assert g["sum_check"]["exact"] is True
    assert math.isclose(sum(r["ms"] for r in g["waterfall"] if r["kind"] in ("start", "step", "residual") and r["ms"] is not None),
                        16.0, abs_tol=1e-12)
    t_meas = 2.16e9 / 4000e9 * 1e3
    assert math.isclose(w["lost bandwidth: memory ceiling"]["ms"], t_meas - 0.45)
    assert w["all-reduce"]["ms"] == 0.0
    assert math.isclose(w["lost bandwidth: kernels at decode shapes"]["ms"], 0.9 - t_meas)
    assert math.isclose(w["launch overhead"]["ms"], 6.0 - 0.9)
    assert math.isclose(w["framework overhead"]["ms"], 15.0 - 6.0)
    assert w["server overhead: completion loop"]["ms"] == 0.0
    assert math.isclose(w["server overhead: HTTP/SSE streaming"]["ms"], 0.25)  # client on free cores
    assert math.isclose(g["predicted_ms"], 15.25)
    assert math.isclose(g["residual_ms"], 0.75)
    assert g["live_itl_ms"] == 16.0 and g["live_itl_field"] == "median_itl_per_token_ms"
    assert math.isclose(g["closure_ratio"], 15.25 / 16.0)
    assert math.isclose(g["explained_fraction"], 1 - 0.75 / 16.0)
    assert math.isclose(g["headline"]["efficiency"], 0.45 / 16.0)
    assert g["headline"]["closure_pass"] is True and g["headline"]["negative_residual"] is False
    assert g["observed_server_overhead_ms"] == 1.0
    for r in g["waterfall"]:
        assert r["source"] and r["status"] in ("measured", "modelled", "unavailable")
    levers = g["levers"]
    saves = [l["saves_ms"] for l in levers if l["saves_ms"] is not None]
    assert saves == sorted(saves, reverse=True)
    assert levers[0]["name"] == "static KV cache + compile (CUDA graphs)" and math.isclose(levers[0]["saves_ms"], 13.0)
    names = [l["name"] for l in levers]
    assert "capture CUDA graphs" in names
    audit = [l for l in levers if l["source"].startswith("audit.json")]
    assert len(audit) == 1 and audit[0]["saves_ms"] is None and "MaxReadReq" in audit[0]["name"]
    assert audit[0]["saves_status"].startswith("unavailable")
    assert levers[-1] is audit[0]
    assert g["headline"]["top_levers"] == levers[:3]


def test_negative_residual_is_flagged():
    inputs = gpu_inputs()
    inputs["live"]["levels"][1]["median_itl_per_token_ms"] = 12.0
    g = attribute(inputs)
    res = steps(g)["unexplained residual"]
    assert res["ms"] < 0 and res["negative"] is True and "negative" in res["note"]
    assert g["headline"]["negative_residual"] is True
    assert g["sum_check"]["exact"] is True
    assert math.isclose(g["explained_fraction"], 1 - abs(12.0 - 15.25) / 12.0)
    assert g["headline"]["unexplained_component"].startswith("over-prediction")


def test_cpu_stand_in_kernel_level_is_kept_off_the_chain():
    inputs = gpu_inputs(
        roofline={"tp": 1, "t_memory_ms": None, "bytes_per_token_per_gpu": 3.0e8},
        memory={"read_gbps": {"value": 20.0, "status": "measured"}, "copy_gbps": 15.0},
    )
    inputs["simulate"]["kernel"] = {"status": "ok", "format_match": False, "stand_in": "fp32 stand-in", "eager_ms": 90.0,
                                    "graph_ms": None, "graph_reason": "CUDA graphs need a GPU", "components": []}
    inputs["simulate"]["engine"] = {"status": "ok", "engine": "llama.cpp", "eager_ms": 20.0, "serving_ms": 20.0,
                                    "loop": {"overhead_ms": 3.0}, "cpu_saturated": True}
    inputs["live"] = {"engine": "llama.cpp", "levels": [{"concurrency": 1, "median_itl_per_token_ms": 24.0}]}
    g = attribute(inputs)
    w = steps(g)
    roof = 3.0e8 / 20e9 * 1e3
    assert math.isclose(g["roofline_ms"], roof) and "measured" in w["roofline (weights + KV at measured bandwidth)"]["note"]
    assert w["lost bandwidth: memory ceiling"]["status"] == "unavailable"
    assert w["lost bandwidth: kernels at decode shapes"]["status"] == "unavailable"
    assert w["launch overhead"]["status"] == "unavailable"
    combined = next(r for r in g["waterfall"] if r.get("absorbs"))
    assert combined["name"] == "lost bandwidth: kernels at decode shapes + launch overhead + framework overhead"
    assert math.isclose(combined["ms"], 20.0 - roof)
    assert math.isclose(w["server overhead: HTTP/SSE streaming"]["ms"], 0.30)  # engine on every core: client counts
    assert math.isclose(g["predicted_ms"], 23.3)
    assert g["sum_check"]["exact"] is True
    assert g["kernel_ms"] == 90.0 and g["levels"]["kernel_comparable"] is False
    # the engine's whole step beyond its bytes is a lever of its own, saying why it is not split
    lever = next(lv for lv in g["levers"] if lv["name"].startswith("the engine's decode step"))
    assert math.isclose(lever["saves_ms"], 20.0 - roof) and "fp32 stand-in" in lever["evidence"]
    assert "llama.cpp" in lever["evidence"] and lever["rank"] == 1


def test_graph_server_without_engine_level_names_the_unexplained_part():
    inputs = gpu_inputs()
    inputs["simulate"]["engine"] = {"status": "skipped", "engine": "vllm", "reason": "engine level not measured: vLLM"}
    inputs["live"] = {"engine": "vllm", "levels": [{"concurrency": 1, "median_itl_per_token_ms": 5.0}]}
    g = attribute(inputs)
    w = steps(g)
    assert w["launch overhead"]["ms"] == 0.0 and "captures CUDA graphs" in w["launch overhead"]["note"]
    assert w["framework overhead"]["status"] == "unavailable"
    assert g["headline"]["closure_basis"] == "kernel" and g["headline"]["closure_pass"] is False
    assert "framework overhead" in g["headline"]["unexplained_component"]
    assert g["sum_check"]["exact"] is True
    assert "capture CUDA graphs" not in [l["name"] for l in g["levers"]]


def test_unmeasured_server_keeps_the_kernel_levels_eager_launches_off_the_chain():
    """No live ITL, no engine level and no engine named (stages.live false, simulate.engine none): the kernel level's
    eager launches are not the server's, so the chain stops at its CUDA graph and "capture CUDA graphs" is a lever
    for eager servers only, without a saving."""
    inputs = gpu_inputs()
    inputs["simulate"]["engine"] = {"status": "skipped", "engine": "none",
                                    "reason": "engine level not measured: disabled by simulate.engine: none"}
    inputs["live"] = {"status": "skipped", "reason": "stages.live is false in the config", "levels": [],
                      "engine": "unknown"}
    g = attribute(inputs, {"live": "stages.live is false in the config"})
    w = steps(g)
    launch = w["launch overhead"]
    assert launch["status"] == "unavailable" and launch["ms"] is None
    assert "stages.live is false" in launch["why"] and "eager 6.000 ms, one CUDA graph 0.900 ms" in launch["why"]
    # the kernel level's CUDA graph, then the HTTP/SSE streaming the server calibration measured: no launches
    assert math.isclose(g["predicted_ms"], 0.9 + w["server overhead: HTTP/SSE streaming"]["ms"])
    lever = next(lv for lv in g["levers"] if lv["name"].startswith("capture CUDA graphs"))
    assert lever["name"] == "capture CUDA graphs, if the server launches its kernels eagerly"
    assert lever["saves_ms"] is None and lever["saves_status"].startswith("unavailable: the server was not measured")
    assert "SGLang" in lever["evidence"] and "6.000" in lever["evidence"]
    # a live ITL of an unnamed server bounds the chain: the eager launches stay a measured step
    inputs["live"] = {"status": "ok", "engine": "unknown", "levels": [{"concurrency": 1, "completed": 8,
                                                                      "median_itl_per_token_ms": 7.0}]}
    g = attribute(inputs)
    assert steps(g)["launch overhead"]["status"] == "measured"
    assert next(lv for lv in g["levers"] if lv["name"] == "capture CUDA graphs")["saves_ms"] == pytest.approx(5.1)


def test_simulate_engine_none_does_not_hide_the_live_servers_engine():
    """simulate.engine: none records engine "none"; the live stage's SGLang is still the server's engine, which
    captures CUDA graphs, so no launch overhead is charged."""
    inputs = gpu_inputs()
    inputs["simulate"]["engine"] = {"status": "skipped", "engine": "none",
                                    "reason": "engine level not measured: disabled by simulate.engine: none"}
    inputs["live"] = {"status": "ok", "engine": "sglang", "levels": [{"concurrency": 1, "completed": 8,
                                                                     "median_itl_per_token_ms": 5.0}]}
    g = attribute(inputs)
    assert g["engine"] == "sglang"
    launch = steps(g)["launch overhead"]
    assert launch["ms"] == 0.0 and "sglang captures CUDA graphs" in launch["note"]
    assert not [lv for lv in g["levers"] if lv["name"].startswith("capture CUDA graphs")]


def test_every_input_missing_does_not_crash():
    g = attribute({})
    assert g["status"] == "partial"
    assert all(r["status"] == "unavailable" for r in g["waterfall"] if r["name"] != "all-reduce")
    assert g["explained_fraction"] is None and g["closure_ratio"] is None and g["sum_check"] is None


def test_tp_allreduce_modelled_from_microbench():
    inputs = gpu_inputs()
    inputs["roofline"].update(tp=8, allreduces_per_token=34, t_comm_floor_ms=0.2)
    inputs["allreduce"] = {"allreduce_us_at_model_size": {"value": 20.0, "unit": "us", "status": "measured"}}
    g = attribute(inputs)
    ar = steps(g)["all-reduce"]
    assert math.isclose(ar["ms"], 34 * 20.0 / 1000) and ar["status"] == "modelled"
    lever = next(l for l in g["levers"] if l["name"].startswith("faster all-reduce"))
    assert math.isclose(lever["saves_ms"], 0.68 - 0.2)
    assert g["sum_check"]["exact"] is True


def test_attribute_files_reads_and_labels_skipped(tmp_path):
    inputs = gpu_inputs()
    paths = {}
    for key, data in inputs.items():
        write_json(tmp_path / f"{key}.json", data)
        paths[key] = str(tmp_path / f"{key}.json")
    write_json(tmp_path / "memory.json", {"stage": "microbench.memory", "status": "skipped", "reason": "no bench"})
    paths["gemm"] = str(tmp_path / "absent.json")
    g = attribute_files(paths)
    assert g["inputs_unavailable"]["memory"].startswith("memory.json: skipped")
    assert g["inputs_unavailable"]["gemm"] == "absent.json is missing"
    assert steps(g)["lost bandwidth: memory ceiling"]["status"] == "unavailable"
    assert g["sum_check"]["exact"] is True
    data, why = load_input(None)
    assert data is None and why


@pytest.mark.parametrize("live_key", ["mean_itl_per_token_ms", "median_itl_ms", "median_tpot_ms"])
def test_live_itl_fallbacks(live_key):
    inputs = gpu_inputs()
    inputs["live"] = {"levels": [{"concurrency": 1, live_key: 16.0}]}
    g = attribute(inputs)
    assert g["live_itl_ms"] == 16.0 and g["live_itl_field"] == live_key


def test_missing_roofline_still_predicts_from_the_engine():
    inputs = gpu_inputs(roofline={"tp": 1}, memory=None)
    g = attribute(inputs, {"roofline": "roofline.json: skipped (test)", "memory": "memory.json is missing"})
    first = next(r for r in g["waterfall"] if r.get("absorbs"))
    assert first["absorbs"][0] == "roofline" and first["name"].startswith("roofline + ")
    assert math.isclose(first["ms"], 0.9)  # from zero to the kernel level's graph time
    assert math.isclose(g["predicted_ms"], 15.25) and g["headline"]["efficiency"] is None
    assert g["sum_check"]["exact"] is True


def test_corun_measurement_is_the_http_step_when_present():
    inputs = gpu_inputs()
    inputs["simulate"]["engine"].update(engine="llama.cpp", eager_ms=15.0, serving_ms=15.0,
                                        loop={"overhead_ms": 2.0, "per_token_ms": 17.0},
                                        corun={"per_token_ms": 21.0, "stack": "sse"}, cpu_saturated=True)
    g = attribute(inputs)
    w = steps(g)
    assert math.isclose(w["server overhead: HTTP/SSE streaming"]["ms"], 4.0)
    assert w["server overhead: HTTP/SSE streaming"]["source"] == "simulate.json (engine level, co-run)"
    assert math.isclose(g["predicted_ms"], 15.0 + 2.0 + 4.0)
    assert g["sum_check"]["exact"] is True


# ---------------------------------------------------------------------------------------------------- issue 15
def test_kernel_above_engine_is_an_inconsistency_and_explains_nothing():
    base = attribute(gpu_inputs())
    inputs = gpu_inputs()
    inputs["simulate"]["kernel"].update(eager_ms=20.0)  # kernel level slower than the engine level (15 ms)
    g = attribute(inputs)
    fw = steps(g)["framework overhead"]
    assert math.isclose(fw["ms"], -5.0) and fw["inconsistent"] is True
    inc = fw["inconsistency"]
    assert math.isclose(inc["ms"], 5.0)
    assert "kernel level (eager) (20.000 ms) is 5.000 ms per token slower than the engine level" in inc["what"]
    assert "different hosts" in inc["likely_cause"]
    assert g["sum_check"]["exact"] is True  # the chain still sums: the sign is kept, the step is flagged
    # the +14.1 launch step and the -5 framework step offset each other; explained does not rise
    assert math.isclose(g["residual_ms"], base["residual_ms"])
    assert math.isclose(g["explained_fraction"], 1 - (0.75 + 5.0) / 16.0)
    assert g["explained_fraction"] < base["explained_fraction"]
    h = g["headline"]
    assert h["explained_fraction"] == g["explained_fraction"] and math.isclose(h["inconsistent_ms"], 5.0)
    assert h["inconsistencies"][0]["step"] == "framework overhead"
    assert h["inconsistency_note"].startswith("1 inconsistent step (5.000 ms") and "not counted as explained" in \
        h["inconsistency_note"]
    assert h["unexplained_component"].startswith("inconsistent levels:")
    assert h["closure_pass"] is False


def test_offsetting_steps_cannot_inflate_explained():
    """Any +x/-x pair lowers explained by x/live: it is never higher than without the pair."""
    prev = attribute(gpu_inputs())["explained_fraction"]
    for eager in (16.0, 20.0, 40.0, 200.0):
        inputs = gpu_inputs()
        inputs["simulate"]["kernel"].update(eager_ms=eager)
        g = attribute(inputs)
        assert g["explained_fraction"] < prev or g["explained_fraction"] == prev == 0.0
        prev = g["explained_fraction"]
    assert prev == 0.0  # floored


def test_negative_residual_is_an_inconsistency_counted_once():
    inputs = gpu_inputs()
    inputs["live"]["levels"][1]["median_itl_per_token_ms"] = 12.0
    g = attribute(inputs)
    res = steps(g)["unexplained residual"]
    assert res["inconsistent"] is True and math.isclose(res["inconsistency"]["ms"], 3.25)
    assert math.isclose(g["explained_fraction"], 1 - 3.25 / 12.0)
    assert g["headline"]["inconsistent_ms"] == 0  # the residual counts through |residual| only


def test_mixed_devices_are_refused_with_the_reason():
    inputs = gpu_inputs()
    inputs["memory"].update(device="NVIDIA H200")
    inputs["simulate"]["engine"].update(device="NVIDIA H200", hardware_revision="h200-a")
    inputs["simulate"]["kernel"].update(device="cpu: AMD EPYC", hardware_revision="h200-a", eager_ms=548.0,
                                        graph_ms=None, graph_reason="CUDA graphs need a GPU")
    g = attribute(inputs, hardware_revision="h200-a")
    assert "kernel" in g["refused_levels"]
    reason = g["refused_levels"]["kernel"]
    assert "cpu: AMD EPYC" in reason and "NVIDIA H200" in reason
    w = steps(g)
    for name in ("lost bandwidth: kernels at decode shapes", "launch overhead"):
        assert w[name]["status"] == "unavailable" and w[name]["why"].startswith("refused:")
        assert "never subtracted" in w[name]["why"]
    combined = next(r for r in g["waterfall"] if r.get("absorbs"))
    assert combined["name"].endswith("framework overhead") and combined["ms"] > 0  # engine - roofline chain
    assert not any(r.get("inconsistent") for r in g["waterfall"])
    assert g["kernel_ms"] is None and g["levels"]["kernel_comparable"] is False
    assert g["measured_on"]["run"] == {"device": "NVIDIA H200", "hardware_revision": "h200-a"}
    assert combined["measured_on"] == "NVIDIA H200, rev h200-a"
    assert "simulate/kernel.json" in g["inputs_unavailable"]["kernel"]


def test_other_hardware_revision_is_refused():
    inputs = gpu_inputs()
    inputs["simulate"]["engine"].update(hardware_revision="laptop-cpu")
    g = attribute(inputs, hardware_revision="h200-a")
    assert g["refused_levels"]["engine"].startswith("simulate/engine.json was measured on hardware revision laptop-cpu")
    assert steps(g)["framework overhead"]["status"] == "unavailable"
    assert g["engine_ms"] is None


def test_attribute_files_keeps_the_measuring_fingerprint(tmp_path):
    write_json(tmp_path / "live.json", gpu_inputs()["live"])
    g = attribute_files({"live": tmp_path / "live.json"}, hardware_revision="h200-a", fingerprint={"kernel": "6.8"})
    assert g["fingerprint"] == {"kernel": "6.8"} and g["hardware_revision"] == "h200-a"


# ---------------------------------------------------------------------------------------------------- issue 12
def _embedded_inputs(server_eval, eval_delta=0.6):
    inputs = gpu_inputs()
    inputs["simulate"]["engine"].update(engine="llama.cpp", eager_ms=10.4, serving_ms=10.4, cores=2,
                                        loop={"overhead_ms": 0.5, "per_token_ms": 10.9},
                                        corun={"per_token_ms": 12.4, "alone_per_token_ms": 10.9, "delta_ms": 1.5,
                                               "eval_delta_ms": eval_delta, "stack": "sse"}, cpu_saturated=True)
    inputs["live"] = {"status": "ok", "engine": "llama.cpp", "embedded": True,
                      "server_eval": {"status": "measured" if server_eval else "unavailable",
                                      "why": None if server_eval else "8 log blocks for 7 streamed requests"},
                      "levels": [{"concurrency": 1, "completed": 8, "median_itl_per_token_ms": 14.3,
                                  "median_server_eval_ms_per_token": server_eval}]}
    return inputs


def test_cpu_contention_is_a_measured_step_from_the_servers_own_eval():
    g = attribute(_embedded_inputs(12.9))
    w = steps(g)
    c = w["CPU contention: the engine under live load"]
    assert c["status"] == "measured" and math.isclose(c["ms"], 12.9 - 10.4)
    # the co-run's own eval slowdown is contention: the streaming step keeps only the rest
    assert math.isclose(w["server overhead: HTTP/SSE streaming"]["ms"], 1.5 - 0.6)
    assert math.isclose(g["predicted_ms"], 12.9 + 0.5 + 0.9)
    assert g["sum_check"]["exact"] is True
    assert math.isclose(g["residual_ms"], 14.3 - 14.3, abs_tol=1e-9)


def test_cpu_contention_unavailable_keeps_the_old_chain_and_says_why():
    g = attribute(_embedded_inputs(None))
    w = steps(g)
    c = w["CPU contention: the engine under live load"]
    assert c["status"] == "unavailable" and "log blocks" in c["why"]
    assert math.isclose(w["server overhead: HTTP/SSE streaming"]["ms"], 1.5)
    assert math.isclose(g["predicted_ms"], 10.4 + 0.5 + 1.5)


def test_communication_floor_uses_the_measured_allreduce_at_tp2():
    inputs = gpu_inputs()
    inputs["roofline"].update(tp=2, allreduces_per_token=64, t_comm_floor_ms=0.385,
                              provenance={"t_comm_floor_ms": "modelled: 64 x (6 us + bytes/link)"})
    inputs["simulate"]["kernel"].update(tp=2, components=[{"name": "all-reduce", "ms": 0.943, "status": "measured"}])
    inputs["allreduce"] = {"world_size": 2, "figures": {
        "allreduce_us_at_model_size_eager": {"value": 43.2, "unit": "us", "status": "measured"},
        "allreduce_us_at_model_size_graph": {"value": 10.4, "unit": "us", "status": "measured"}}}
    g = attribute(inputs)
    c = g["communication_floor"]
    assert math.isclose(c["graph_ms"], 64 * 10.4 / 1000) and math.isclose(c["eager_ms"], 64 * 43.2 / 1000)
    assert c["floor_status"] == "measured" and math.isclose(c["floor_ms"], c["graph_ms"])
    assert math.isclose(c["graph_saves_ms"], 64 * (43.2 - 10.4) / 1000)
    lever = next(lv for lv in g["levers"] if lv["name"].startswith("faster all-reduce"))
    assert lever["saves_status"] == "measured" and math.isclose(lever["saves_ms"], 0.943 - 64 * 10.4 / 1000)
    # one rank measured only: the roofline's modelled floor, labelled so
    inputs["allreduce"] = {"world_size": 1, "figures": {}}
    c = attribute(inputs)["communication_floor"]
    assert c["floor_status"] == "modelled" and c["floor_ms"] == 0.385


# ---------------------------------------------------------------------------------------------------- issue 13
def _trace(step=12.0, busy=4.0, groups=None):
    groups = groups or {"GEMM": 2.5, "attention": 0.6, "norm/activation/elementwise": 0.5, "NCCL": 0.0, "other": 0.3}
    return {"status": "ok", "device": "gpu", "source": {"kind": "file"},
            "waterfall": {"step_ms": step, "gpu_busy_ms": busy, "gpu_idle_ms": step - busy,
                          "kernel_ms_by_group": groups,
                          "kernel_level_components": {"GEMM": ["attention projections", "mlp", "lm_head"],
                                                      "attention": ["attention"],
                                                      "norm/activation/elementwise": ["norms", "final norm"],
                                                      "other": []}}}


def _vllm_inputs(trace):
    inputs = gpu_inputs(trace=trace)
    inputs["simulate"]["engine"] = {"status": "skipped", "reason": "vllm is not measured in-process"}
    inputs["simulate"]["kernel"]["components"] = [
        {"name": "attention projections", "ms": 0.3, "graph_ms": 0.3}, {"name": "mlp", "ms": 1.2, "graph_ms": 1.2},
        {"name": "lm_head", "ms": 0.2, "graph_ms": 0.2}, {"name": "attention", "ms": 0.05, "graph_ms": 0.05},
        {"name": "norms", "ms": 0.1, "graph_ms": 0.1}, {"name": "sampling", "ms": 0.02, "graph_ms": 0.02}]
    inputs["live"] = {"status": "ok", "engine": "vllm",
                      "levels": [{"concurrency": 1, "completed": 8, "median_itl_per_token_ms": 12.6}]}
    return inputs


def test_server_trace_replaces_the_residual_with_measured_steps():
    g = attribute(_vllm_inputs(_trace()))
    w = steps(g)
    assert g["headline"]["closure_basis"] == "trace"
    assert g["sum_check"]["exact"] is True
    assert math.isclose(w["kernels slower than simulated: GEMM"]["ms"], 2.5 - 1.7)
    assert math.isclose(w["kernels the simulation does not have"]["ms"], 0.3)
    assert math.isclose(w["simulated kernels not in the trace"]["ms"], -0.02)
    assert math.isclose(w["stream overlap"]["ms"], 4.0 - 3.9)
    assert math.isclose(w["GPU idle between kernels (CPU, launch or framework)"]["ms"], 8.0)
    # the kernel level (0.9 ms graph) plus the trace's steps is the trace's step; HTTP from the calibration
    assert math.isclose(g["predicted_ms"], 12.0 + 0.25)
    assert math.isclose(g["residual_ms"], 12.6 - 12.25)
    # the attention kernels ran faster in the server than simulated: flagged, never explained
    assert w["kernels slower than simulated: attention"]["ms"] > 0


def test_no_usable_trace_keeps_the_old_chain():
    g = attribute(_vllm_inputs({"status": "skipped", "reason": "no trace configured"}))
    assert g["headline"]["closure_basis"] != "trace"
    assert "GPU idle between kernels (CPU, launch or framework)" not in steps(g)


def test_server_trace_idle_without_and_with_the_profilers_measured_cost():
    raw = steps(attribute(_vllm_inputs(_trace())))["GPU idle between kernels (CPU, launch or framework)"]
    assert raw["status"] == "measured" and "includes the profiler's own cost" in raw["note"]
    trace = _trace()
    trace["waterfall"]["gpu_idle_ms_corrected"] = 7.1  # 0.9 ms of the 8.0 ms idle was the profiler's
    g = attribute(_vllm_inputs(trace))
    idle = steps(g)["GPU idle between kernels (CPU, launch or framework)"]
    assert math.isclose(idle["ms"], 7.1) and idle["status"] == "modelled" and "raw 8.000 ms" in idle["note"]
    assert g["sum_check"]["exact"] is True
    assert math.isclose(g["predicted_ms"], 12.0 - 0.9 + 0.25)


def test_kernel_lever_splits_the_dense_gemms_into_the_kernels_own_and_what_their_sizes_cost():
    """The kernel-shape lever's evidence, where gemm.json has the step's totals for the run's format and batch:
    measured GEMM time against a plain read of the same bytes (the GEMM kernels' own) and against the bytes at copy
    bandwidth (what the sizes cost); older gemm.json files (no step totals) leave the evidence as it was."""
    step = {"step_gemm_us": 4915.2, "step_plain_read_us": 3589.6, "step_at_copy_bw_us": 2383.0, "step_gemm_rows": 12}
    gemm = {"dtypes": {"nvfp4": {"by_m": {"1": step}}}}
    inputs = gpu_inputs(gemm=gemm)
    inputs["roofline"] = {**inputs["roofline"], "weight_format": "nvfp4", "batch_size": 1}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert ("the step's nvfp4 dense GEMMs (M=1, 12 of them x their layers) take 4.915 ms against 3.590 ms for a "
            "plain read of their bytes, so 1.326 ms is the GEMM kernels' own and 1.207 ms what their sizes cost"
            ) in lever["evidence"]
    inputs["gemm"] = {"dtypes": {"nvfp4": {"by_m": {"1": {"frac_of_copy_bw_median": 0.5}}}}}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "plain read" not in lever["evidence"] and lever["evidence"].endswith("below streaming speed)")


def test_kernel_lever_adds_the_routed_experts_grouped_gemv_against_a_plain_read():
    """moe.json at the run's batch and format, times its MoE layers: the grouped GEMV's time against a plain read of
    the selected experts' bytes joins the kernel-shape lever's evidence; a moe.json from another device is refused
    like any other level."""
    moe = {"device": "cuda: NVIDIA H200", "shape": {"moe_layers": 75},
           "by_m": {"1": {"experts_grouped_gemv_nvfp4_us": 53.18, "experts_grouped_gemv_nvfp4_plain_read_us": 40.55}}}
    inputs = gpu_inputs(moe=moe)
    inputs["roofline"] = {**inputs["roofline"], "weight_format": "nvfp4", "batch_size": 1}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert ("the routed experts' grouped GEMV (nvfp4, M=1, x 75 MoE layers) takes 3.989 ms against 3.041 ms for a "
            "plain read of the selected experts' bytes") in lever["evidence"]
    for level in ("memory", "gemm", "launch"):
        inputs[level] = {"device": "cuda: NVIDIA H200"}
    inputs["moe"] = {**moe, "device": "cuda: NVIDIA B200"}
    g = attribute(inputs)
    assert g["refused_levels"]["moe"].startswith("microbench/moe.json was measured on cuda: NVIDIA B200")
    lever = next(l for l in g["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "routed experts" not in lever["evidence"]


def test_kernel_lever_quotes_the_nvfp4_fused_moe_the_kernel_level_runs():
    """NVFP4 experts run the fused MoE at every batch on the kernel level, so where moe.json has both rows at the
    run's batch the lever quotes the fused MoE's; a moe.json with the grouped GEMV alone (older results) still
    gives that."""
    moe = {"device": "cuda: NVIDIA H200", "shape": {"moe_layers": 75},
           "by_m": {"1": {"experts_grouped_gemv_nvfp4_us": 26.4, "experts_grouped_gemv_nvfp4_plain_read_us": 9.0,
                          "experts_fused_moe_nvfp4_us": 16.9, "experts_fused_moe_nvfp4_plain_read_us": 9.0}}}
    inputs = gpu_inputs(moe=moe)
    inputs["roofline"] = {**inputs["roofline"], "weight_format": "nvfp4", "batch_size": 1}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert ("the routed experts' fused MoE (nvfp4, M=1, x 75 MoE layers) takes 1.268 ms against 0.675 ms for a "
            "plain read") in lever["evidence"]


def test_a_kernel_level_far_from_the_moe_stages_row_says_the_call_differs():
    """The kernel level's routed experts (scaled to every layer) against the MoE stage's row times the MoE layers:
    past 1.5x either way the lever's evidence and the gap's notes say the two call the same kernel differently (the
    NVFP4 fused MoE's align over the model's whole table spilled: 2.45x the stage's row on the H200); within it,
    nothing is added."""
    moe = {"device": "cuda: NVIDIA H200", "shape": {"moe_layers": 75},
           "by_m": {"32": {"experts_fused_moe_nvfp4_us": 196.85, "experts_fused_moe_nvfp4_plain_read_us": 115.33}}}
    for level_ms, flagged in ((36.22, True), (8.0, True), (16.2, False), (10.71, False)):
        inputs = gpu_inputs(moe=moe)
        inputs["roofline"] = {**inputs["roofline"], "weight_format": "nvfp4", "batch_size": 32}
        inputs["simulate"]["kernel"]["components"] = [{"name": "routed experts", "ms": level_ms,
                                                       "graph_ms": level_ms, "status": "measured"}]
        g = attribute(inputs)
        lever = next(l for l in g["levers"] if l["name"].startswith("decode kernels at streaming"))
        said = [n for n in g["notes"] if "the two call the same kernel differently" in n]
        assert bool(said) == flagged and (("the two call" in lever["evidence"]) == flagged), level_ms
        if level_ms == 36.22:
            assert said[0].startswith("The kernel level's routed experts take 36.220 ms a step, 2.45x the 14.764 ms "
                                      "that the MoE stage's fused MoE row predicts for its 75 MoE layers at M=32")


def test_kernel_lever_adds_decode_attention_at_the_runs_context_on_its_fastest_kernels():
    """attention.json's fastest backend per case at the run's batch and context, times the layers of each kind
    (GQA: full and sliding layers; DSA: the indexer over the context and MLA over its top-k), against the KV bytes
    at copy bandwidth; a case the stage did not time leaves the evidence without attention."""
    gqa = {"device": "cuda: NVIDIA H200",
           "shape": {"kind": "gqa", "layers": 26, "sliding_layers": 20, "sliding_window": 512},
           "best": {"sdpa B=1 L=4096": {"best_backend": "triton:split-kv", "us": 8.0, "gbps": 2150.0},
                    "sdpa-sliding B=1 L=512": {"best_backend": "sdpa:flash_attention", "us": 5.0, "gbps": 430.0}}}
    inputs = gpu_inputs(attention=gqa)
    inputs["roofline"] = {**inputs["roofline"], "batch_size": 1, "context_len": 4096}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    # 6 x 8.0 + 20 x 5.0 = 148 us; at 4300 GB/s: 6 x 8.0 x 0.5 + 20 x 5.0 x 0.1 = 34 us
    assert ("decode attention at 4096 tokens (B=1, x its layers) takes 0.148 ms on the fastest kernels measured "
            "(triton:split-kv, sdpa:flash_attention) against 0.034 ms for its bytes at copy bandwidth") in lever["evidence"]
    assert "microbench/attention.json" in lever["source"]
    dsa = {"shape": {"kind": "mla", "layers": 78, "index_heads": 32, "index_topk": 2048},
           "best": {"mla-absorbed-sparse B=1 L=2048": {"best_backend": "triton:split-kv", "us": 20.0, "gbps": 1500.0},
                    "dsa-indexer B=1 L=4096": {"best_backend": "triton scores + radix select", "us": 43.0, "gbps": 24.0}}}
    inputs["attention"] = dsa
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "takes 4.914 ms on the fastest kernels measured (triton:split-kv, triton scores + radix select)" in lever["evidence"]
    inputs["attention"] = {**dsa, "best": {k: v for k, v in dsa["best"].items() if "indexer" not in k}}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "decode attention" not in lever["evidence"]


def test_kernel_lever_reads_a_block_scaled_fp8_run_from_the_gemm_stages_fp8_rows():
    step = {"step_gemm_us": 2000.0, "step_plain_read_us": 1600.0, "step_at_copy_bw_us": None, "step_gemm_rows": 9}
    inputs = gpu_inputs(gemm={"dtypes": {"fp8": {"by_m": {"1": step}}}},
                        moe={"shape": {"moe_layers": 58}, "by_m": {"1": {"experts_grouped_gemv_fp8_block_us": 80.0,
                                                                          "experts_grouped_gemv_fp8_block_plain_read_us": 66.0}}})
    inputs["roofline"] = {**inputs["roofline"], "weight_format": "fp8-block", "batch_size": 1}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "the step's fp8 dense GEMMs (M=1, 9 of them x their layers) take 2.000 ms against 1.600 ms" in lever["evidence"]
    assert "so 0.400 ms is the GEMM kernels' own (microbench/gemm.json" in lever["evidence"]  # no copy-bandwidth part
    assert "grouped GEMV (fp8-block, M=1, x 58 MoE layers) takes 4.640 ms against 3.828 ms" in lever["evidence"]


def test_kernel_lever_reads_the_fused_moe_above_batch_1():
    inputs = gpu_inputs(moe={"shape": {"moe_layers": 58}, "by_m": {"8": {
        "experts_fused_moe_fp8_block_us": 110.0, "experts_fused_moe_fp8_block_plain_read_us": 75.0,
        "experts_fused_moe_fp8_us": 108.0, "experts_fused_moe_fp8_plain_read_us": 74.0}}})
    inputs["roofline"] = {**inputs["roofline"], "weight_format": "fp8-block", "batch_size": 8}
    lever = next(l for l in attribute(inputs)["levers"] if l["name"].startswith("decode kernels at streaming"))
    assert "fused MoE (fp8-block, M=8, x 58 MoE layers) takes 6.380 ms against 4.350 ms" in lever["evidence"]


def test_one_gpu_standing_for_tp8_models_its_all_reduces_from_the_datasheet_not_a_one_rank_call():
    """The seeds' deployment on one H200 (tp=8, all-reduce measured at 1 rank): the kernel level added 158 calls of a
    0.87 us 1-rank all-reduce (0.14 ms), which moves no byte between GPUs. The roofline's datasheet model (1.06 ms)
    stands instead; the kernel level's step moves by the difference, so the kernels' own loss is unchanged."""
    inputs = gpu_inputs()
    inputs["roofline"].update(tp=8, allreduces_per_token=156, t_comm_floor_ms=1.055,
                              provenance={"t_comm_floor_ms": "modelled: 156 all-reduces x (6 us latency + ring)"})
    inputs["allreduce"] = {"world_size": 1, "measured_world_size": 1,
                           "allreduce_us_at_model_size": {"value": 0.87, "unit": "us", "status": "measured"}}
    one_rank = 158 * 0.87 / 1000
    inputs["simulate"]["kernel"].update(tp=8, eager_ms=6.0 + one_rank, graph_ms=0.9 + one_rank, components=[
        {"name": "all-reduce", "ms": one_rank, "eager_ms": one_rank, "graph_ms": one_rank, "status": "modelled"}])
    g = attribute(inputs)
    w = steps(g)
    assert math.isclose(w["all-reduce"]["ms"], 1.055) and w["all-reduce"]["status"] == "modelled"
    assert "measured at 1 rank, not tp=8" in w["all-reduce"]["note"] and "6 us latency" in w["all-reduce"]["note"]
    assert w["all-reduce"]["one_rank"] is True
    t_meas = 2.16e9 / 4000e9 * 1e3
    assert math.isclose(w["lost bandwidth: kernels at decode shapes"]["ms"], 0.9 - t_meas)  # the kernels' own
    assert math.isclose(w["launch overhead"]["ms"], 6.0 - 0.9)
    assert g["sum_check"]["exact"] is True
    lever = next(lv for lv in g["levers"] if lv["name"].startswith("faster all-reduce"))
    assert lever["saves_ms"] is None and "not measured at tp ranks" in lever["saves_status"]
    # without the kernel level, the micro-benchmark's 1-rank call gives way to the datasheet model too
    inputs["simulate"]["kernel"] = {"status": "skipped", "reason": "not run"}
    ar = steps(attribute(inputs))["all-reduce"]
    assert math.isclose(ar["ms"], 1.055) and ar["one_rank"] is True
    # measured at tp ranks: the measurement stands
    inputs["allreduce"]["measured_world_size"] = 8
    ar = steps(attribute(inputs))["all-reduce"]
    assert math.isclose(ar["ms"], 156 * 0.87 / 1000) and "one_rank" not in ar
