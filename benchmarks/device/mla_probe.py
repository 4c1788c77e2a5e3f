"""Probe (H200): GLM-5's sparse MLA decode (64 heads, latent 512 + rope 64, the 2048 rows DSA keeps of a 32k cache)
by split count, heads a program and warps: the whole call and the combine alone (CUDA-graph replay, median us).

    PYTHONPATH=workflow python3 benchmarks/device/mla_probe.py [--rows-kept 2048] [--cache 32768] [--heads 64]
        [--splits 4,8,16,32,64] [--block-h 16,32,64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import attention as attn  # noqa: E402
from decode_gap.microbench.timing import time_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-kept", type=int, default=2048)
    ap.add_argument("--cache", type=int, default=32768)
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--heads", type=int, default=64, help="heads on this GPU (GLM-5 at TP8: 8)")
    ap.add_argument("--splits", default="4,8,16,32,64")
    ap.add_argument("--block-h", default="16,32,64")
    a = ap.parse_args()
    dev = torch.device("cuda")
    h, lora, rope = a.heads, 512, 64
    for m in map(int, a.tokens.split(",")):
        qq = torch.randn((m, h, lora + rope), device=dev, dtype=torch.bfloat16)
        kv = torch.randn((m, a.cache, lora + rope), device=dev, dtype=torch.bfloat16)
        rows = torch.rand((m, a.cache), device=dev).argsort(dim=-1)[:, :a.rows_kept].to(torch.int32).contiguous()
        ref = attn.reference_mla(qq.float(), kv.float().gather(1, rows.long()[..., None].expand(-1, -1, lora + rope)),
                                 lora, 0.07)
        default = attn.MlaDecode(m, h, lora, rope, a.rows_kept, dev)
        print(f"M={m}: default splits {default.splits}, block_h {default.block_h}", flush=True)
        for bh in map(int, a.block_h.split(",")):
            for warps in (4, 8):
                for splits in map(int, a.splits.split(",")):
                    try:
                        mla = attn.MlaDecode(m, h, lora, rope, a.rows_kept, dev, splits=splits, block_h=bh, warps=warps)
                        err = attn_err(mla(qq, kv, 0.07, rows=rows), ref)
                        us = time_graph([lambda: mla(qq, kv, 0.07, rows=rows)], 3, 30, dev).median_us
                        comb = time_graph([lambda: attn._combine(mla.part, mla.lse, mla.out)], 3, 30, dev).median_us
                        print(f"  block_h {bh:2d} warps {warps} splits {splits:2d}: {us:6.1f} us (combine {comb:5.1f})"
                              f" err {err:.1e}", flush=True)
                    except Exception as exc:  # a tile that does not fit (registers, shared memory)
                        print(f"  block_h {bh:2d} warps {warps} splits {splits:2d}: {type(exc).__name__}", flush=True)
                        torch.cuda.synchronize()


def attn_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


if __name__ == "__main__":
    main()
