"""Device probe (H200): why the kernel level's routed experts (GLM-5-NVFP4 TP8, batch 32) read ~480 us a layer where
the MoE stage reads ~200. Builds the kernel level's step (a few layers), records each MoE layer's routing ids, prints
how they spread over the experts, then times one layer's fused MoE (CUDA-graph replay after an L2 flush) with the
recorded ids and with uniform ids (8 distinct of 256 a token, as the MoE stage draws them). H200 (2026-12-04): the
router's ids were uniform (163-170 experts hit a layer, at most 5 pairs an expert, like uniform draws' 163) and both
timed 494 us, so the choice of experts was not the cause (moe_e_probe.py found it).

    PYTHONPATH=workflow python3 benchmarks/device/moe_ids_probe.py [--batch 32] [--layers 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.model import load_model_card  # noqa: E402
from decode_gap.simulate.formats import probe_formats  # noqa: E402
from decode_gap.simulate.shapes import plan_layers, step_shapes  # noqa: E402
from decode_gap.simulate.step import DecodeStep  # noqa: E402
from decode_gap.simulate.timing import L2Flusher, spread, time_cuda  # noqa: E402
from decode_gap.timing import capture_graph  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def spread_of(ids: torch.Tensor, e: int) -> str:
    counts = torch.bincount(ids.flatten().long(), minlength=e)
    hit = int((counts > 0).sum())
    blocks8 = int(((counts + 7) // 8).sum())
    return f"experts hit {hit}, max pairs an expert {int(counts.max())}, blocks of 8: {blocks8}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--model", default="glm-5.json")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--tp", type=int, default=8)
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    spec = load_model_card(REPO / "config" / "models" / a.model)
    shapes = step_shapes(spec, a.tp, 1, a.batch, 512)
    fmt = probe_formats(a.format, dev, a.batch)
    plan = plan_layers(shapes, a.layers, None)
    with torch.inference_mode():
        step = DecodeStep(shapes, plan, fmt, dev, 512, "greedy")
        recorded: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        routed = [op for op in step.ops if op.component == "routed experts"]
        last_routed = routed[-1].fn  # timed alone below, without the recording wrapper
        for op in routed:
            fn = op.fn

            def rec(S, fn=fn):
                recorded.append((S["h"].clone(), S["ids"].clone(), S["w"].clone()))
                fn(S)
            op.fn = rec
        step.runner(lambda op: True)()
        torch.cuda.synchronize()
        E = shapes.experts
        for i, (_h, ids, _w) in enumerate(recorded):
            print(f"layer {i}: {spread_of(ids, E)}", flush=True)
        # the router's logits' spread across tokens: cosine of each token's h to the batch mean
        h = recorded[-1][0].float()
        cos = torch.nn.functional.cosine_similarity(h, h.mean(0, keepdim=True).expand_as(h), dim=1)
        print(f"last layer's h: cosine to the batch mean min {cos.min():.3f} median {cos.median():.3f}", flush=True)
        flusher = L2Flusher(dev)
        S = step.S
        h, ids, w = recorded[-1]
        k = ids.shape[1]
        gen = torch.Generator(device="cpu").manual_seed(1)
        uni = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(a.batch)]).to(dev, ids.dtype)
        print(f"uniform: {spread_of(uni, E)}", flush=True)
        for name, use in [("recorded", ids), ("uniform", uni)]:
            S["h"], S["ids"], S["w"] = h, use.contiguous(), w
            run = (lambda: last_routed(S))
            run()
            g = capture_graph([run])
            t = spread(time_cuda(g.replay, 3, 30, flusher))
            print(f"{name}: fused MoE {t['median_ms'] * 1e3:.1f} us (min {t['min_ms'] * 1e3:.1f})", flush=True)


if __name__ == "__main__":
    main()
