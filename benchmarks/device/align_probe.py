"""Device probe (H200): the fused MoEs' align (fusedmoe.align_pairs) alone, the stable sort against the atomic form
(a histogram, then an atomic add a pair on its expert's cursor) in chunks and warps around ALIGN_CHUNK and
ALIGN_ATOMIC_WARPS, from 1 to 1024 tokens at top-8 over 256 experts, in blocks of fp4moe.block_m_for's size. Each form
is checked against the blocks the pairs must fill (every pair once, in its expert's run, padding after), then timed:
a CUDA graph of one align from an idle GPU (rotated rounds, decode_gap.timing.rotated) and its kernel time from the
profiler. At 320 tokens the sort took 58 us of a 375 us NVFP4 MoE call (2026-12-05); at 64 tokens 5.0.

    PYTHONPATH=workflow python3 benchmarks/device/align_probe.py [--tokens 1 8 32 ...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import fp4moe  # noqa: E402
from decode_gap.kernels import fusedmoe as fm  # noqa: E402
from decode_gap.simulate.timing import spread, time_cuda  # noqa: E402
from decode_gap.timing import capture_graph, rotated  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_e_probe import kernel_times  # noqa: E402


def blocks_ok(ids: torch.Tensor, sp: torch.Tensor, be: torch.Tensor, experts: int, bm: int) -> str:
    """'ok' where the blocks hold every pair once, an expert a block in expert order, its pairs first in its run."""
    flat, rows, exp = ids.reshape(-1).tolist(), sp.tolist(), be.tolist()
    p = len(flat)
    at = 0
    for e in sorted({x for x in flat if 0 <= x < experts}):
        mine = sorted(i for i, x in enumerate(flat) if x == e)
        run = rows[at:at + len(mine) + (-len(mine) % bm)]
        if sorted(run[:len(mine)]) != mine or set(run[len(mine):]) - {p}:
            return f"FAILED at expert {e}"
        if exp[at // bm:(at + len(run)) // bm] != [e] * (len(run) // bm):
            return f"FAILED: expert {e}'s blocks"
        at += len(run)
    if set(rows[at:]) - {p} or set(exp[at // bm:]) - {-1}:
        return "FAILED: past the last run"
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 32, 64, 128, 256, 320, 512, 1024])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    e2 = fm._pow2(a.experts + 1)
    cursor = fm.align_cursor(a.experts, dev)
    for m in a.tokens:
        ids = torch.stack([torch.randperm(a.experts, device=dev)[:a.top_k] for _ in range(m)]).int()
        p = ids.numel()
        bm = fp4moe.block_m_for(p, a.experts)
        nb = fm.max_blocks(p, a.experts, bm)
        sp = torch.empty(nb * bm, dtype=torch.int32, device=dev)
        be = torch.empty(nb, dtype=torch.int32, device=dev)
        forms = {"sort": lambda: fm.align_pairs(ids, sp, be, a.experts, bm, rank="sort")}
        for ch in sorted({min(fm._pow2(p), c) for c in (512, 1024, 2048)}):
            for warps in (4, 8, 16):
                forms[f"atomic ch{ch} w{warps}"] = (
                    lambda ch=ch, warps=warps: fm._align_atomic_kernel[(1,)](
                        ids, sp, be, cursor, p, a.experts, nb, CH=ch, E2=e2, NB2=fm._pow2(nb), BM=bm,
                        num_warps=warps))
        print(f"== {m} tokens x top-{a.top_k} = {p} pairs over {a.experts} experts, blocks of {bm}, {nb} blocks "
              f"(default form: {fm.ALIGN_RANK}, chunk {fm.ALIGN_CHUNK}, "
              f"{fm.ALIGN_ATOMIC_WARPS} warps)", flush=True)
        graphs = {}
        for name, fn in forms.items():
            sp.fill_(-7)
            be.fill_(-7)
            fn()
            torch.cuda.synchronize()
            print(f"  {name}: {blocks_ok(ids.cpu(), sp.cpu(), be.cpu(), a.experts, bm)}", flush=True)
            graphs[name] = capture_graph([fn])
        samples = rotated(lambda replay: time_cuda(replay, 3, 20, None), {n: g.replay for n, g in graphs.items()},
                          a.rounds)
        for name, fn in forms.items():
            t = spread(samples[name])
            print(f"  {name}: graph {t['median_ms'] * 1e3:.1f} us (min {t['min_ms'] * 1e3:.1f}, p99 "
                  f"{t['p99_ms'] * 1e3:.1f}); kernel {kernel_times(fn)}", flush=True)


if __name__ == "__main__":
    main()
