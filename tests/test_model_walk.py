"""Every causal-LM architecture the installed transformers maps, built small on the meta device, through the
roofline, the micro-benchmark shapes and the kernel-level step shapes (tests/model_walk.py).

An architecture fails here only when transformers itself cannot build its defaults (the reason is kept); the
families the issue names must all work, and every count must equal transformers' own."""

import pytest

pytest.importorskip("transformers")

from model_walk import FAMILIES, walk_all  # noqa: E402

NAMED = {"mixtral", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama", "llama4", "llama4_text", "gemma2", "gemma3",
         "gemma3_text", "phi3", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "olmoe", "glm_moe_dsa", "mistral"}


@pytest.fixture(scope="module")
def rows():
    return walk_all()


def test_walk_every_causal_lm(rows, capsys):
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    with capsys.disabled():
        print(f"\nmodel walk: {len(ok)} of {len(rows)} causal-LM architectures build on the meta device and run the roofline; "
              f"{sum(1 for r in ok if r['kv_unavailable'])} of them with some KV unavailable")
        for r in failed:
            print(f"  {r['model_type']}: {r['why']}")
    assert {r["status"] for r in failed} <= {"no-build", "no-config"}
    assert all(r["why"] for r in failed)
    for r in ok:
        assert r["params_total"] == r["transformers_count"], r["model_type"]
        assert 0 < r["params_active"] <= r["params_total"], r["model_type"]
        assert r["t_comm_floor_ms"] is None or r["t_comm_floor_ms"] > 0, r["model_type"]
    present = {r["model_type"] for r in rows}
    assert NAMED & present <= {r["model_type"] for r in ok}
    assert len(ok) >= 0.85 * len(rows)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scaled_down_family_runs_every_stage_shape(family):
    from decode_gap.hardware import resolve_hardware
    from decode_gap.microbench import shapes as mshapes
    from decode_gap.model import parameter_counts, spec_from_dict
    from decode_gap.roofline import compute_roofline
    from decode_gap.simulate.shapes import layer_bytes, step_shapes
    from model_walk import REPO

    spec = spec_from_dict(FAMILIES[family], f"<{family}>")
    assert parameter_counts(spec)["params_total"] == spec.transformers_count
    r = compute_roofline(spec, resolve_hardware("h100-sxm", REPO / "config" / "hardware"), "bf16", tp=2, context_len=64)
    assert r["kv_unavailable_layers"] == 0 and r["t_floor_ms"] > 0 and r["t_comm_floor_ms"] > 0
    for tp in (1, 2):
        gs = mshapes.gemm_shapes(spec, tp=tp)
        assert gs and all(g.n > 0 and g.k > 0 for g in gs)
        assert mshapes.attention_shape(spec, tp=tp).heads > 0
        assert (mshapes.moe_shape(spec, tp=tp) is not None) == spec.is_moe
        sh = step_shapes(spec, tp=tp)
        assert len(sh.layer_kinds) == spec.layers
        assert all(layer_bytes(sh, k, 2.0, 2.0, 65) > 0 for k in sh.kinds)
