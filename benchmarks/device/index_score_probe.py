"""Probe: the DSA indexer's scores kernel (kernels.attention._index_score_kernel) over FP8 keys with bf16 and with
FP8 queries, at several rows a program (BLOCK_T) and warps, GLM-5's 32 heads of 128; every form checked against
torch ops, then timed by CUDA-graph replay over rotating copies of the keys (median us) and its read bandwidth
(keys, their scales and the queries) printed beside it.

    PYTHONPATH=workflow python3 benchmarks/device/index_score_probe.py [--rows 1,8] [--lengths 4096,32768]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import attention as attn  # noqa: E402
from decode_gap.microbench.timing import rotating_copies, time_graph  # noqa: E402


def scores(q, keys, kscale, qscale, wts, block_t: int, warps: int) -> torch.Tensor:
    """attention.index_scores' launch with block_t rows a program and `warps` warps."""
    m, ih, idim = q.shape
    t = keys.shape[1]
    out = torch.empty((m, t), dtype=torch.float32, device=q.device)
    attn._index_score_kernel[(math.ceil(t / block_t), m)](
        q, keys, kscale, out if qscale is None else qscale, wts, out, t, ih, 0.5, q.stride(0), q.stride(1),
        keys.stride(0), keys.stride(1), kscale.stride(0), 0 if qscale is None else qscale.stride(0), wts.stride(0),
        out.stride(0), ID=idim, BLOCK_H=max(16, ih), BLOCK_T=block_t, F32_DOTS=False, SCALED=True,
        Q_SCALED=qscale is not None, num_warps=warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--forms", default="64x4,128x4,128x8,256x8")
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    ih, idim = a.heads, 128
    for m in map(int, a.rows.split(",")):
        for t in map(int, a.lengths.split(",")):
            nbytes = m * t * (idim + 4) + m * ih * (idim + 4)
            n = rotating_copies(nbytes, dev)
            keys = [torch.randn((m, t, idim), device=dev).to(attn.INDEX_KEY_DTYPE) for _ in range(n)]
            kscale = torch.rand((m, t), device=dev)
            wts = torch.rand((m, ih), device=dev)
            qb = torch.randn((m, ih, idim), device=dev).to(torch.bfloat16)
            q8, qscale = qb.to(attn.INDEX_KEY_DTYPE), torch.rand((m, ih), device=dev)
            cells = []
            for qname, q, qs in (("bf16 q", qb, None), ("fp8 q", q8, qscale)):
                ref = attn.index_scores_reference(q, keys[0], wts, 0.5, kscale, qs)
                for form in a.forms.split(","):
                    bt, w = map(int, form.split("x"))
                    got = scores(q, keys[0], kscale, qs, wts, bt, w)
                    ok = ((got - ref).norm() / ref.norm()).item() < 1e-2
                    us = time_graph([lambda k=k: scores(q, k, kscale, qs, wts, bt, w) for k in keys], 3, 30,
                                    dev).median_us
                    cells.append(f"{qname} {form} {us:.2f} ({nbytes / us / 1e3:.0f} GB/s){'' if ok else ' WRONG'}")
            print(f"M={m} T={t} ({n} copies, {nbytes / 1e6:.2f} MB): " + " | ".join(cells), flush=True)
            del keys
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
