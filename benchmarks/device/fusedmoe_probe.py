"""Probe (H200): the routed experts above batch 1 in fp8, the fused MoE (kernels/fusedmoe.py, block and per-expert
scales) against `_scaled_grouped_mm` after torch-op sorting, as the kernel level builds them (simulate.layers.Experts),
DeepSeek-V3 TP8 shapes (256 experts of 7168 x 256 a rank, top 8).

    PYTHONPATH=workflow python3 benchmarks/device/fusedmoe_probe.py [--sim]
    PYTHONPATH=workflow python3 benchmarks/device/fusedmoe_probe.py sweep     # gate_up and down forms, 2-16 tokens

Why: the micro-benchmark (lowprec_device.py --sections fusedmoe) put the fused MoE 2.3-2.6x ahead of the per-tensor
path at 2-16 tokens, yet the kernel level's DeepSeek-V3 TP8 batch-8 step measured routed experts 5.41 ms (per-tensor)
against 6.37 (fused). This times both on LAYERS layers of their own weights, one graph (as the kernel level measures
a component), with the ids (a) the same 8 experts for every token and (b) 8 random experts a token, and with --sim
counts the distinct experts each MoE layer of the kernel level's step actually routes its batch to.

What it found (2026-12-03, H200), us a layer: `_scaled_grouped_mm` 106.6 (the same 8 experts) / 305.2 (8 random a
token, 61 experts hit); the fused MoE 72.5 / 118.2 (per-expert scales 73.0 / 118.7). The kernel level's step routed
its batch to 50-61 experts a layer with the fused MoE but to 2 (after the first layer) with the per-tensor path: its
fp8 weights had a scale of 1, so every linear grew the hidden state about sqrt(K) times until the router's choice
collapsed (the per-tensor scales are 0.02 since, simulate.layers.FP8_SCALE). So 5.41 ms was the cost of reading 2
experts a layer; since, 17.81 ms on `_scaled_grouped_mm` against 6.38 on the fused MoE (55-60 experts a layer).
The sweep (us, 2 / 8 / 16 tokens): gate_up's form for down 42.3 / 103.1 / 203.3; down BLOCK_N 64, 2 stages 42.7 /
107.4 / 212.7; 128, 2 stages 41.7 / 103.9 / 205.1; 256 with 4 or 8 warps 44.7-46.7 / 108.9-119.3 / 212.7-235.8;
gate_up BLOCK_N 64 44.8 / 107.4 / 209.1, 256 with 8 warps 44.2 / 110.1 / 201.7: the default kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from lowprec_device import rotating_choices  # noqa: E402  (benchmarks/, on sys.path)
from decode_gap.microbench.moe import silu_mul  # noqa: E402
from decode_gap.microbench.timing import time_graph  # noqa: E402
from decode_gap.simulate import layers  # noqa: E402

E, H, I, K, M, LAYERS = 256, 7168, 256, 8, 8, 16


# `sweep` mode: the down GEMM's (BLOCK_N, warps, stages) and gate_up's, at 2, 8 and 16 tokens (DeepSeek-V3 TP8: the
# down GEMM's K is 256, two groups, so its programs are short and many)
DOWN_FORMS = [(128, 4, 3), (64, 4, 2), (128, 4, 2), (256, 4, 2), (256, 8, 2), (128, 8, 2), (64, 2, 2)]
GATE_UP_FORMS = [dict(), dict(block_n=64), dict(block_n=128, warps=8), dict(block_n=256, warps=8)]


def sweep() -> None:
    from decode_gap.kernels import fusedmoe

    dev = torch.device("cuda")
    torch.manual_seed(0)
    w13 = fusedmoe.quantize_experts(torch.randn((E, 2 * I, H), device=dev, dtype=torch.bfloat16) * 0.02, True)
    w2 = fusedmoe.quantize_experts(torch.randn((E, H, I), device=dev, dtype=torch.bfloat16) * 0.02, True)
    for m in (2, 8, 16):
        x = torch.randn((m, H), device=dev, dtype=torch.bfloat16)
        w = torch.rand((m, K), device=dev)
        choices = rotating_choices(E, K, m, dev)
        for gu in GATE_UP_FORMS:
            for down in DOWN_FORMS if not gu else DOWN_FORMS[:1]:
                try:
                    moe = fusedmoe.FusedMoe(w13, w2, m, K, dev, down=down, **gu)
                    ref = moe.reference(x, choices[0], w)
                    err = ((moe(x, choices[0], w).float() - ref).norm() / ref.norm()).item()
                    us = time_graph([lambda c=c: moe(x, c, w) for c in choices], 3, 20, dev).median_us
                    print(f"M={m:<2} gate_up {gu or 'default'} down {down}: {us:7.1f} us (rel err {err:.1e}"
                          f"{'' if err < 2e-2 else ' FAILED'})", flush=True)
                except Exception as exc:
                    print(f"M={m:<2} gate_up {gu} down {down}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn((M, H), device=dev, dtype=torch.bfloat16)
    w = torch.rand((M, K), device=dev)
    same = torch.randperm(E, device=dev)[:K].repeat(M, 1)
    spread = rotating_choices(E, K, M, dev, n=1)[0]
    for kind, backend in (("fp8", "scaled_grouped_mm"), ("fp8-moe", "fused_moe"), ("fp8-block-moe", "fused_moe")):
        ex = [layers.Experts(E, I, H, kind, "bf16", str(dev), backend, K) for _ in range(LAYERS)]
        for name, ids in (("same 8 experts", same), ("8 random a token", spread)):
            ids = ids.long() if kind == "fp8" else ids.int()
            hit = len(set(ids.reshape(-1).tolist()))
            us = time_graph([lambda e=e: e(x, ids, w, silu_mul) for e in ex], 2, 10, dev).median_us
            print(f"{kind:<14} {name:<18} {hit:>3} experts hit: {us:7.1f} us a layer", flush=True)
        del ex
        torch.cuda.empty_cache()
    if "--sim" in sys.argv:
        sim()


def sim() -> None:
    """The kernel level's step (6 layers), per-tensor experts and the fused MoE: the routed experts' component and
    the distinct experts the eager calls route to (the first full step's, then the component's timed runs)."""
    from decode_gap.model import load_model_card
    from decode_gap.simulate import formats
    from decode_gap.simulate.kernel import KernelSettings, simulate_kernel

    orig, probe = layers.Experts.__call__, formats._probe_fused_moe
    spec = load_model_card(str(Path(__file__).resolve().parents[2] / "config/models/deepseek-v3.json"))
    for fused in (False, True):
        hits: list[int] = []

        def spy(self, x, ids, weights, act_fn, hits=hits):
            if not torch.cuda.is_current_stream_capturing():
                hits.append(len(set(ids.reshape(-1).tolist())))
            return orig(self, x, ids, weights, act_fn)

        layers.Experts.__call__ = spy
        formats._probe_fused_moe = probe if fused else (lambda device, block: False)
        r = simulate_kernel(spec, KernelSettings(tp=8, ranks=1, batch=8, weight_format="fp8-block", warmup=1,
                                                 iters=3, layers=6))
        comp = {c["name"]: c["ms"] for c in r["components"]}
        print(f"kernel level, {r['moe_backend']}: routed experts {comp.get('routed experts'):.3f} ms for "
              f"{r['layers_total']} layers ({r['layers_simulated']} simulated); distinct experts a MoE layer, first "
              f"calls {hits[:6]}, last calls {hits[-6:]}", flush=True)
    layers.Experts.__call__, formats._probe_fused_moe = orig, probe

if __name__ == "__main__":
    sweep() if sys.argv[1:2] == ["sweep"] else main()
