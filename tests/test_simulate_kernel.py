"""Kernel level on the CPU: tiny layer counts, real torch kernels, real gloo all-reduce between two ranks."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decode_gap.model import load_model_card, spec_from_dict
from decode_gap.simulate.kernel import COMPONENT_ORDER, KernelSettings, simulate_kernel

REPO = Path(__file__).resolve().parents[1]

TINY_MLA = {  # DeepSeek-V3 layout (MLA, DSA indexer as in GLM-5, shared + routed experts), tiny sizes
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 128, "num_hidden_layers": 4, "vocab_size": 512,
    "num_attention_heads": 4, "intermediate_size": 256, "kv_lora_rank": 32, "q_lora_rank": 48,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
    "n_group": 4, "topk_group": 2, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 16,
}
TINY_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
}
FAST = dict(warmup=1, iters=2, context_len=32)


def _check_scaling(r):
    total = 0.0
    for seg, m in r["segments"].items():
        total += m["eager"]["median_ms"] * m["scale"]
    ar = next((c for c in r["components"] if c["name"] == "all-reduce" and c["status"] == "modelled"), None)
    total += ar["ms"] if ar else 0.0
    assert math.isclose(total, r["eager_ms"], rel_tol=1e-9)


def test_mla_moe_step_on_cpu():
    spec = spec_from_dict(TINY_MLA)
    r = simulate_kernel(spec, KernelSettings(weight_format="bf16", layers=2, **FAST))
    assert r["status"] == "ok" and r["device"].startswith("cpu")
    assert r["eager_ms"] > 0 and r["graph_ms"] is None and "GPU" in r["graph_reason"]
    assert r["layers_simulated"] == 2 and r["layers_total"] == 4 and r["scale"] == 2.0
    assert r["scale_by_kind"] == {"dense/full": 1.0, "moe/full": 3.0}
    names = [c["name"] for c in r["components"]]
    for want in ("embedding", "norms", "attention projections", "attention", "mlp", "router", "shared expert",
                 "routed experts", "final norm", "lm_head", "sampling"):
        assert want in names
    assert names == [n for n in COMPONENT_ORDER if n in names]
    assert all(c["status"] == "measured" and c["ms"] > 0 for c in r["components"])
    assert r["format_match"] is True and r["moe_backend"] == "loop"
    assert r["allreduce"]["mode"] == "none"
    _check_scaling(r)


def test_mla_a_projections_run_as_one_gemv(monkeypatch):
    """q_a and kv_a read the same hidden state: one GEMV of both rows, as SGLang and vLLM run them."""
    from decode_gap.simulate import step as step_module

    built = []

    class Recorded(step_module.Linear):
        def __init__(self, n, k, *args, **kwargs):
            built.append((n, k))
            super().__init__(n, k, *args, **kwargs)

    monkeypatch.setattr(step_module, "Linear", Recorded)
    r = simulate_kernel(spec_from_dict(TINY_MLA), KernelSettings(weight_format="bf16", layers=2, **FAST))
    assert r["status"] == "ok"
    hidden, q_lora, latent = 128, 48, 32 + 8
    assert built.count((q_lora + latent, hidden)) == 2  # one a layer
    assert (q_lora, hidden) not in built and (latent, hidden) not in built


def test_stand_in_format_and_modelled_allreduce():
    spec = spec_from_dict(TINY_MOE)
    r = simulate_kernel(spec, KernelSettings(tp=2, ranks=1, weight_format="gguf-q4_k_m", layers=1, sampling="top_p",
                                             allreduce_us=10.0, allreduce_source="allreduce.json", **FAST))
    assert r["format_match"] is False and "stand-in" in r["stand_in"]
    assert r["dtypes"]["linear"] == "fp32"
    ar = [c for c in r["components"] if c["name"] == "all-reduce"]
    assert len(ar) == 1 and ar[0]["status"] == "modelled"
    assert math.isclose(ar[0]["ms"], (2 * 2 + 2) * 10.0 / 1000)
    assert r["allreduce"]["mode"] == "modelled"
    _check_scaling(r)


def test_modelled_allreduce_unavailable_is_labelled():
    spec = spec_from_dict(TINY_MOE)
    r = simulate_kernel(spec, KernelSettings(tp=2, ranks=1, weight_format="bf16", layers=1,
                                             allreduce_why="allreduce.json: skipped", **FAST))
    ar = [c for c in r["components"] if c["name"] == "all-reduce"]
    assert ar[0]["status"] == "unavailable" and ar[0]["ms"] is None
    assert r["allreduce"]["mode"] == "unavailable"


def test_real_gloo_allreduce_two_ranks():
    spec = spec_from_dict(TINY_MOE)
    r = simulate_kernel(spec, KernelSettings(tp=2, weight_format="bf16", layers=1, **FAST))
    assert r["world_size"] == 2 and r["allreduce"]["mode"] == "real" and r["allreduce"]["backend"] == "gloo"
    ar = [c for c in r["components"] if c["name"] == "all-reduce"]
    assert len(ar) == 1 and ar[0]["status"] == "measured" and ar[0]["ms"] > 0


def test_shipped_default_card_one_layer_per_kind():
    spec = load_model_card(REPO / "config" / "models" / "gemma-3-270m.json")
    r = simulate_kernel(spec, KernelSettings(weight_format="gguf-q4_k_m", layers=1, warmup=0, iters=1, context_len=16))
    assert r["layers_simulated"] == 2  # one sliding-window layer and one full-attention layer
    assert r["layers_by_kind"] == {"dense/sliding": {"total": 15, "simulated": 1},
                                   "dense/full": {"total": 3, "simulated": 1}}
    assert r["eager_ms"] > 0 and not r["format_match"]


def test_gathered_logits_keep_their_size_over_many_iterations():
    # Timed on its own, the logits all-gather runs back to back: it must never gather its own output again
    # (which doubled the logits every call: 2^iters growth, an OOM kill of every rank in the tp=2 pipeline).
    spec = spec_from_dict(TINY_MOE)
    r = simulate_kernel(spec, KernelSettings(tp=2, weight_format="bf16", layers=1, warmup=2, iters=30, context_len=32))
    assert r["world_size"] == 2 and r["status"] == "ok"
    head_ar = [c for c in r["components"] if c["name"] == "all-reduce"]
    assert head_ar and head_ar[0]["ms"] < 1000


def test_linear_attention_layers_are_a_labelled_stand_in():
    # Qwen3-Next mixes Gated DeltaNet (linear attention) with full attention: the step has no kernel for the
    # linear layers' state update, so it runs standard attention there and says so (kept off the gap's chain).
    pytest.importorskip("transformers")
    cfg = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
           "num_hidden_layers": 4, "vocab_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "linear_num_value_heads": 4,
           "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
           "full_attention_interval": 4}
    try:
        spec = spec_from_dict(cfg)
    except Exception as exc:  # an older transformers without qwen3_next
        pytest.skip(f"qwen3_next not buildable here: {exc}")
    r = simulate_kernel(spec, KernelSettings(weight_format="bf16", layers=2, **FAST))
    assert r["format_match"] is False and "linear attention layers run standard attention" in r["stand_in"]
    assert any(s["case"].endswith("kernels") for s in r["skipped"])


def test_nvfp4_routed_experts_run_the_grouped_gemv_in_the_interpreter():
    """NVFP4 experts at the kernel level: the grouped NVFP4 GEMV over each token's selected experts (ids and routing
    weights copied into its buffers), against dequantise-then-matmul; its asm needs a GPU, so the CPU interpreter
    runs the same layout and decode (lowprec_device.py checks the GPU)."""
    code = r'''
import torch
from decode_gap.kernels import lowprec as lp
from decode_gap.simulate.formats import _probe_grouped
from decode_gap.simulate.layers import Experts
torch.manual_seed(0)
assert _probe_grouped("cpu", "nvfp4") == "grouped_gemv"
E, I, H, k = 6, 64, 128, 2
ex = Experts(E, I, H, "nvfp4", "fp32", "cpu", "grouped_gemv", top_k=k)
assert ex.per_expert_bytes == (2 * I * H + H * I) // 2 + (2 * I * H + H * I) // 16 + 8
x = torch.randn(3, H)
ids = torch.tensor([[4, 1], [0, 5], [4, 4]])
w = torch.rand(3, k)
got = ex(x, ids, w, None)
d13, d2 = lp.dequantized_experts(ex.grouped)
for m in range(3):
    ref = lp.reference_experts(x[m:m + 1].to(torch.bfloat16), d13, d2, ids[m].to(torch.int32), w[m])
    err = ((got[m:m + 1] - ref).norm() / ref.norm()).item()
    assert err < 1e-2, (m, err)
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_nvfp4_routed_experts_run_the_fused_moe_in_the_interpreter():
    """NVFP4 experts at the kernel level where the fused MoE runs (probe_formats: `nvfp4-moe`): the same weights
    give what the grouped GEMV gives a token at a time, at 3 tokens with experts shared between them, and the layer
    builds one fused MoE a batch size."""
    code = r'''
import torch
from decode_gap.simulate.formats import _probe_fused_nvfp4, _probe_grouped, _probe_grouped_nvfp4
from decode_gap.simulate.layers import Experts
assert _probe_grouped("cpu", "nvfp4-moe") == "fused_moe"
why = []
assert _probe_fused_nvfp4("cpu", why) and _probe_grouped_nvfp4("cpu", why) and not why  # what probe_formats runs
# where a kernel does not run, its probe says why in one line (the kernel level's stand-in note carries it)
from decode_gap.simulate.formats import _failed
assert not _failed(why, "the NVFP4 fused MoE", ValueError("no\nmore"))
assert why == ["the NVFP4 fused MoE: ValueError: no"]
E, I, H, k = 6, 64, 128, 2
torch.manual_seed(0)
fused = Experts(E, I, H, "nvfp4-moe", "fp32", "cpu", "fused_moe", top_k=k)
torch.manual_seed(0)
grouped = Experts(E, I, H, "nvfp4", "fp32", "cpu", "grouped_gemv", top_k=k)
assert fused.per_expert_bytes == grouped.per_expert_bytes and fused.nbytes == grouped.nbytes
x = torch.randn(3, H)
ids = torch.tensor([[4, 1], [0, 4], [1, 5]])
w = torch.rand(3, k)
want = grouped(x, ids, w, None)
for call in range(2):  # the second call finds the sums the first left at zero
    got = fused(x, ids, w, None)
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-2, (call, err)
built = fused.fused
fused(x[:1], ids[:1], w[:1], None)
assert fused.fused is not built and fused.fused.m == 1
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_shared_expert_runs_inside_the_fused_moe_in_the_interpreter():
    """Where the routed experts run a fused MoE and the shared expert has their shape (DeepSeek-V3, GLM-5), it is
    one more expert of it at batch 1, the token's (k+1)-th pair with weight 1, as SGLang fuses it: no shared-expert
    op, the routing writes the column (the Triton kernel, or torch ops where it does not run), and both give the
    same logits (the same weights; CPU interpreter, NVFP4 experts). Above step.FUSE_SHARED_MAX_BATCH it stays apart;
    within it at 8 rows, 8 pairs on it, the same logits either way."""
    code = r'''
import torch
from decode_gap.model import spec_from_dict
from decode_gap.simulate.formats import probe_formats
from decode_gap.simulate.shapes import plan_layers, step_shapes
from decode_gap.simulate.step import DecodeStep

card = {**%r, "moe_intermediate_size": 64}  # whole K steps of the fused MoE (64 values)
spec = spec_from_dict(card)
shapes = step_shapes(spec, 1, 1, 1, 40)
plan = plan_layers(shapes, 2, None)
fmt = {**probe_formats("bf16", "cpu", 1), "activations": "fp32", "linear": "fp32", "experts": "nvfp4-moe"}
E, k = shapes.experts, shapes.top_k
logits, bytes_ = {}, {}
for fused in (True, False):
    torch.manual_seed(0)
    with torch.inference_mode():
        step = DecodeStep(shapes, plan, fmt, "cpu", 40, "greedy", fused=fused)
        step.runner(lambda op: True)()
    assert step.shared_note and not any(op.component == "shared expert" for op in step.ops)
    ids, w = step.S["ids"], step.S["w"]
    assert ids.shape == w.shape == (1, k + 1) and int(ids[0, k]) == E and float(w[0, k]) == 1.0
    logits[fused], bytes_[fused] = step.S["logits"].float(), step.weight_bytes
assert bytes_[True] == bytes_[False]
err = ((logits[True] - logits[False]).norm() / logits[False].norm()).item()
assert err < 1e-3, err
# above the fused MoE's limit (its form's FUSE_SHARED_MAX_BATCH; 1 here) the shared expert runs apart
import decode_gap.simulate.step as step_mod
step_mod.FUSE_SHARED_MAX_BATCH["nvfp4-moe"] = 1
shapes8 = step_shapes(spec, 1, 1, 8, 40)
with torch.inference_mode():
    step = DecodeStep(shapes8, plan_layers(shapes8, 2, None), {**fmt, **probe_formats("bf16", "cpu", 8),
                      "experts": "nvfp4-moe"}, "cpu", 40, "greedy", fused=False)
assert not step.shared_note and any(op.component == "shared expert" for op in step.ops)
# fused above batch 1 where FUSE_SHARED_MAX_BATCH allows (NVFP4's default, 32): each token's (k+1)-th pair the
# shared expert, 8 pairs on it, and the routing kernel and torch ops give the same logits
step_mod.FUSE_SHARED_MAX_BATCH["nvfp4-moe"] = 8
logits8 = {}
for fused in (True, False):
    torch.manual_seed(0)
    with torch.inference_mode():
        step = DecodeStep(shapes8, plan_layers(shapes8, 2, None), {**fmt, **probe_formats("bf16", "cpu", 8),
                          "experts": "nvfp4-moe"}, "cpu", 40, "greedy", fused=fused)
        step.runner(lambda op: True)()
    assert step.shared_note and not any(op.component == "shared expert" for op in step.ops)
    assert step.S["ids"].shape == (8, k + 1) and bool((step.S["ids"][:, k] == E).all())
    logits8[fused] = step.S["logits"].float()
err = ((logits8[True] - logits8[False]).norm() / logits8[False].norm()).item()
assert err < 2e-2, err  # (at 8 rows the two differ so with the shared expert apart too: 7.9e-3 against 7.8e-3)
print("ok")
''' % (TINY_MLA,)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_kernel_picker_keeps_the_fastest_and_records_each_shape():
    """The kernel level's build-time choice (fp8 linears at batch 1): the faster candidate wins, a shape already
    timed keeps its choice without timing again, and every shape's times are recorded."""
    import time

    from decode_gap.simulate.layers import KernelPicker

    picker = KernelPicker("cpu", warmup=1, iters=3)
    calls = {"slow": 0, "fast": 0}

    def slow():
        calls["slow"] += 1
        time.sleep(0.003)

    def fast():
        calls["fast"] += 1

    assert picker.pick((64, 256, 1), {"slow": slow, "fast": fast}) == "fast"
    before = dict(calls)
    assert picker.pick((64, 256, 1), {"slow": slow, "fast": fast}) == "fast" and calls == before
    assert picker.pick((32, 256, 1), {"slow": fast, "fast": slow}) == "slow"
    assert [r["shape"] for r in picker.records] == ["64x256x1", "32x256x1"]
    rec = picker.records[0]
    assert rec["chosen"] == "fast" and rec["us"]["slow"] > rec["us"]["fast"] and rec["clock"] == "wall time"
    assert picker.summary("fp8 linears") == ("fp8 linears: fast on 1 of 2 shapes, slow on 1 of 2 shapes "
                                             "(each shape timed at build: kernel_choices in simulate/kernel.json)")
    attention = KernelPicker("cpu", warmup=1, iters=3)  # shapes of several kinds: counted per kind
    attention.pick(("topk", 1, 4097, 2048), {"radix": fast, "torch": slow})
    attention.pick(("mla", 1, 64, 2048), {"split": fast, "bmm": slow})
    attention.pick(("mla", 8, 64, 2048), {"split": slow, "bmm": fast})
    assert attention.summary("decode attention").startswith(
        "decode attention: topk: radix on 1 of 1 shapes; mla: split on 1 of 2 shapes, bmm on 1 of 2 shapes (")


def test_kernel_picker_leaves_inputs_in_l2_where_the_kernel_before_wrote_them():
    """An op fed by the kernel before it (the indexer's top-k) is timed without the flush, and its record says so;
    the other ops keep the flush before each call."""
    from decode_gap.simulate.layers import KernelPicker

    picker = KernelPicker("cpu", warmup=1, iters=3)
    flushes = []
    picker.flush = lambda: flushes.append(1)
    picker.pick(("topk", 1, 8193, 2048), {"a": lambda: None, "b": lambda: None}, inputs_in_l2=True)
    assert flushes == [] and picker.records[-1]["clock"] == "wall time, inputs in cache"
    picker.pick(("mla", 1, 64, 2048), {"a": lambda: None, "b": lambda: None})
    assert len(flushes) == 6 and picker.records[-1]["clock"] == "wall time"
    assert KernelPicker.CLOCK_IN_L2.startswith("CUDA-graph replay of one call, its inputs left in L2")


def test_fp8_linear_runs_the_kernel_the_picker_chose():
    """An fp8 per-tensor linear at batch 1 holds our GEMV and torch._scaled_mm over the same bytes and runs the one
    the picker timed faster; both agree with the dequantised weight (TRITON_INTERPRET on the CPU)."""
    code = r'''
import torch
from decode_gap.simulate.layers import KernelPicker, Linear
torch.manual_seed(0)
picker = KernelPicker("cpu", warmup=1, iters=2)
lin = Linear(64, 256, "fp8-gemv", "fp32", "cpu", picker=picker)
assert lin.nbytes == 64 * 256 + 4
rec = picker.records[0]
assert rec["shape"] == "64x256x1" and set(rec["us"]) == {"lowprec.DenseGemv", "torch._scaled_mm"}
assert lin.kind == ("fp8-gemv" if rec["chosen"] == "lowprec.DenseGemv" else "fp8")
x = torch.randn(1, 256)
ref = x @ lin.w.float().t() * lin.w_scale  # x @ W^T, up to the fp8 rounding of x in torch._scaled_mm
for y in (lin.gemm(x) if lin.gemm is not None else None, lin._scaled_mm(x)):
    if y is None:
        continue
    err = ((y.float() - ref).norm() / ref.norm()).item()
    assert err < 0.1, err
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_bf16_linear_at_one_row_runs_the_kernel_the_picker_chose():
    """A bf16 linear at batch 1 (the router, the indexer's weights) runs whichever of our bf16 GEMV (its default
    block, and on narrow shapes a shorter K block too), F.linear and the swapped torch.mm the picker chose; all give
    x @ W^T (TRITON_INTERPRET on the CPU). Past NARROW_ROWS rows the shorter block is not offered."""
    code = r'''
import torch
from decode_gap.kernels import lowprec as lp
from decode_gap.simulate.layers import NARROW_GEMV, NARROW_ROWS, KernelPicker, Linear

NARROW = f"lowprec.DenseGemv ({lp.GemvConfig(*NARROW_GEMV).name})"
LIBRARY = {"torch linear (cuBLAS)", "torch.mm(W, x^T) (cuBLAS)"}


class Forced(KernelPicker):  # test double for the timing: the choice is the test's
    def __init__(self, name, offered):
        super().__init__("cpu")
        self.name, self.offered = name, offered

    def pick(self, key, candidates):
        assert set(candidates) == self.offered, set(candidates)
        return self.name


torch.manual_seed(0)
x = torch.randn(1, 256).to(torch.bfloat16)
for name, kind in (("lowprec.DenseGemv", "bf16-gemv"), (NARROW, "bf16-gemv"), ("torch linear (cuBLAS)", "bf16"),
                   ("torch.mm(W, x^T) (cuBLAS)", "bf16-swapped")):
    lin = Linear(64, 256, "bf16", "bf16", "cpu")
    lin._pick_bf16_gemv(64, 256, "cpu", Forced(name, {"lowprec.DenseGemv", NARROW} | LIBRARY))
    assert lin.kind == kind, (name, lin.kind)
    if name.startswith("lowprec"):
        assert lin.gemm.cfg.block_k == (NARROW_GEMV[1] if name == NARROW else lp.DENSE_CONFIGS[0].block_k), name
    y, ref = lin(x).float(), x.float() @ lin.w.float().t()
    assert y.shape == (1, 64) and ((y - ref).norm() / ref.norm()).item() < 1e-2, name
wide = Linear(NARROW_ROWS + 8, 256, "bf16", "bf16", "cpu")
wide._pick_bf16_gemv(NARROW_ROWS + 8, 256, "cpu", Forced("lowprec.DenseGemv", {"lowprec.DenseGemv"} | LIBRARY))
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_fused_step_matches_the_torch_ops_step_in_the_interpreter():
    """The kernel level's GPU path (fused norms, rope, the qkv append, split-KV GQA and MLA decode, the DSA indexer
    scores and its radix-select top-k with the MLA reading the selected rows in place, fused routing) wired into the
    step gives the logits the torch-ops step gives: the same weights and caches (the same seed, and the kernels'
    timing draws nothing from it), one decode step each in fp32, in the CPU interpreter. Qwen3-MoE layout (GQA with qk-norm), the DeepSeek-V3 layout, and GLM-5's (the same with its
    indexer, which keeps fewer rows than the cache holds)."""
    code = r'''
import torch
from decode_gap.model import spec_from_dict
from decode_gap.simulate.formats import probe_formats
from decode_gap.simulate.shapes import plan_layers, step_shapes
from decode_gap.simulate.step import DecodeStep
from decode_gap.simulate.layers import KernelPicker


# test double for the timing: interpreted Triton always loses on a CPU
def first_candidate(self, key, candidates, inputs_in_l2=False):
    if key not in self.chosen:
        self.chosen[key] = next(iter(candidates))
        self.records.append({"shape": str(key), "chosen": self.chosen[key]})
    return self.chosen[key]


KernelPicker.pick = first_candidate
MOE = %r
MLA = %r
MLA = {**MLA, "qk_rope_head_dim": 16}  # the MLA kernel takes rope widths of 16 and up
DSA = {**MLA, "architectures": ["GlmMoeDsaForCausalLM"]}  # GLM-5: the indexer keeps 16 of the 41 rows
for card, want, picks in ((MOE, "GQA (triton GQA decode", 1), (MLA, "MLA absorbed (triton MLA decode", 1),
                          (DSA, "MLA absorbed (triton MLA decode", 2)):
    spec = spec_from_dict(card)
    shapes = step_shapes(spec, 1, 1, 1, 40)
    plan = plan_layers(shapes, 2, None)
    fmt = {**probe_formats("bf16", "cpu", 1), "activations": "fp32", "linear": "fp32"}  # no bf16 rounding noise
    out = {}
    for fused in (False, True):
        torch.manual_seed(0)
        with torch.inference_mode():
            step = DecodeStep(shapes, plan, fmt, "cpu", 40, "greedy", fused=fused)
            step.runner(lambda op: True)()
        out[fused] = step.S["logits"].float()
        if fused:
            assert step.attention_impl.startswith(want), step.attention_impl
            assert len(step.attn_picker.records) == picks, step.attn_picker.records  # DSA: the top-k too
    err = ((out[True] - out[False]).norm() / out[False].norm()).item()
    assert err < 1e-4, (card["architectures"], err)
print("ok")
''' % (TINY_MOE, TINY_MLA)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "workflow")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


def test_fp8_stand_in_weights_keep_the_hidden_state_in_scale():
    """The per-tensor fp8 weights are unit-normal e4m3 values times FP8_SCALE, so a linear keeps the hidden state's
    size as the bf16 weights do (std 0.02). With a scale of 1 each one grew it about sqrt(K) times and the router of a
    batch of 8 sent every token to the same 2 experts (H200, DeepSeek-V3 fp8): values steer routing, hence bytes."""
    import torch

    from decode_gap.simulate import layers

    k = 4096
    lin = layers.Linear(1024, k, "fp8", "bf16", "cpu")
    ex = layers.Experts(4, 256, k, "fp8", "bf16", "cpu", "loop")
    x = torch.randn(8, k)
    for w, s in ((lin.w, lin.w_scale), (ex.gu[0], ex.scale_gu[0]), (ex.down[0], ex.scale_down[0])):
        w = w.float() * (s if s.dim() == 0 else s[:, None])
        xin = x if w.shape[1] == k else torch.randn(8, w.shape[1])
        growth = ((xin @ w.t()).norm(dim=1) / xin.norm(dim=1)).mean().item()
        assert growth < 4.0, growth  # 0.02 x sqrt(K) x sqrt(N / K): about 1.3 for gate_up here; 64 with a scale of 1


def test_batch_rows_start_from_different_tokens():
    """A batch's rows decode different tokens (rows alike would route alike: top_k experts read where a server's
    batch reads up to B x top_k)."""
    from decode_gap.simulate.formats import probe_formats
    from decode_gap.simulate.shapes import plan_layers, step_shapes
    from decode_gap.simulate.step import DecodeStep

    shapes = step_shapes(spec_from_dict(TINY_MOE), batch=4, context_len=32)
    step = DecodeStep(shapes, plan_layers(shapes, 1, None), probe_formats("bf16", "cpu", 4), "cpu", 32, "greedy")
    assert len(set(step.S["tok"].tolist())) == 4


def test_fused_moe_kinds_fall_back_where_the_per_gpu_shapes_are_not_whole_k_steps():
    """The fused MoEs take K in steps (NVFP4's MMA 64 values, fp8's activation groups 128): Qwen3-30B-A3B at TP8
    has 96 intermediate rows a GPU, so its experts run the grouped NVFP4 GEMV (any K) or fp8's scaled grouped GEMM,
    and the kernel level says so in its notes."""
    from decode_gap.simulate.formats import fused_moe_fallback

    assert fused_moe_fallback("nvfp4-moe", 2048, 768) == "nvfp4-moe"
    assert fused_moe_fallback("nvfp4-moe", 2048, 96) == "nvfp4"
    assert fused_moe_fallback("fp8-block-moe", 7168, 256) == "fp8-block-moe"
    assert fused_moe_fallback("fp8-moe", 2048, 96) == "fp8" and fused_moe_fallback("fp8-block-moe", 2048, 192) == "fp8"
    assert fused_moe_fallback("bf16", 2048, 96) == "bf16"
