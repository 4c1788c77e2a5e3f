"""Device probe (H200): the NVFP4 fused MoE at GLM-5 TP8 shapes (6144 x 256 an expert), 32 tokens x top-8, built
over all 256 experts (as the kernel level builds it) and over only the experts hit, ids compacted (as the MoE stage
builds it); the same pairs. Checks each build against dequantise-then-matmul, then prints its plan, its CUDA-graph
time after an L2 flush, and each kernel's time from the profiler. It found the align kernel's spill (H200,
2026-12-04, 32 tokens: 158 experts hit): the align 324 us over the 256-expert table and 49 us over the 158 hit, the
two GEMMs 74.5 us each; the call 491 / 219 us. With the histogram-and-sort align: 3.6 / 2.9 us, the call 168 / 174 us.
The forms are built, checked and captured first, then timed in rounds that rotate their order (decode_gap.timing.
rotated): timed in a fixed order, the first form read 2-9% faster than the same form timed again last (2026-12-05).

With --l2-weights every expert of a form is expert 0's bytes (stacks of stride 0): the same blocks, programs and x
reads, the weights from the L2 after their first read, so the call's time without the weights' DRAM traffic. If down
takes about as long so, its programs' set-up and latency bound it, not the bytes (the question of down at 320 tokens,
0.45 of a plain read; --walk is the form that answers it).

    PYTHONPATH=workflow python3 benchmarks/device/moe_e_probe.py [--m 32] [--rounds 6] [--only-table [--variants]
        [--split13 N ...] [--pair gate_up|down|both ... [--split2 N]] [--align sort|atomic ...] [--block-m 8|16 ...]
        [--down-by-pair] [--walk N ...] [--l2-weights]]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import fp4moe  # noqa: E402
from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402
from decode_gap.microbench.timing import gbps  # noqa: E402
from decode_gap.simulate.timing import L2Flusher, spread, time_cuda  # noqa: E402
from decode_gap.timing import capture_graph, rotated  # noqa: E402


def kernel_times(fn, gemm_read_us: tuple[float, float] = ()) -> str:
    """Each kernel of a call in launch order, its mean over 10 eager calls (the profiler's CUDA times); with
    `gemm_read_us` (gate_up's and down's bytes at read bandwidth, us), the two GEMM kernels' fraction of it (the first
    and second kernel named _fp4_moe*)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    kernels = [ev for ev in prof.events() if ev.device_type.name == "CUDA"]
    per = len(kernels) // 10
    rows, gemms = [], list(gemm_read_us)
    for i in range(per):
        us = sum(ev.device_time for ev in kernels[i::per]) / 10
        share = ""
        if kernels[i].name.startswith("_fp4_moe") and gemms:
            share = f" ({gemms.pop(0) / us:.2f} of a read)"
        rows.append(f"{kernels[i].name[:24]} {us:.1f}us{share}")
    return "; ".join(rows)


def read_bandwidth_gbps(nbytes: int = 2 * 2**30) -> float:
    """This card's read bandwidth, GB/s: the median of `src.sum()` over 2 GiB, as the microbench stage measures it
    (microbench.memory), so a kernel's fraction of a read is of the card it ran on (H100 and H200 differ)."""
    src = torch.rand(nbytes // 4, device="cuda")
    us = spread(time_cuda(src.sum, 3, 20, None))["median_ms"] * 1e3
    del src
    torch.cuda.empty_cache()
    return gbps(nbytes, us)


def checked(run, w13, w2, x, ids, rw) -> str:
    """A call (twice: the second sees what the first left in the sums and counters) against dequantise-then-matmul
    on the experts chosen: its relative error, and whether it is within the tests' 1e-2."""
    ref = fp4moe.reference(x, ids, rw, lambda j: (nv.dequantize_nvfp4(w13[j]).float(),
                                                  nv.dequantize_nvfp4(w2[j]).float()))
    run()
    err = float((run().float() - ref).norm() / ref.norm())
    return f"rel err {err:.1e} {'ok' if err < 1e-2 else 'FAILED'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--e", type=int, default=256)
    ap.add_argument("--h", type=int, default=6144)
    ap.add_argument("--i", type=int, default=256)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--only-table", action="store_true", help="only the build over the whole table")
    ap.add_argument("--variants", action="store_true", help="with --only-table: no early launch, a tight grid")
    ap.add_argument("--split13", type=int, nargs="*", default=[], help="with --only-table: these gate_up K splits")
    ap.add_argument("--pair", nargs="*", default=[], choices=("gate_up", "down", "both", "none"),
                    help="these GEMMs two tiles a warp too (fp4moe PAIR), each beside the default")
    ap.add_argument("--split2", type=int, default=0, help="with --pair: down's K splits in the pair forms")
    ap.add_argument("--align", nargs="*", default=[], choices=("sort", "atomic"),
                    help="the align's form (fusedmoe.align_pairs), each beside the default")
    ap.add_argument("--block-m", type=int, nargs="*", default=[], choices=(8, 16),
                    help="these pairs a block (fp4moe.block_m_for), each beside the default")
    ap.add_argument("--down-by-pair", action="store_true", help="down's rows a pair, then a top_k sum (no atomics)")
    ap.add_argument("--walk", type=int, nargs="*", default=[],
                    help="down's pair walking these tile groups a program (fp4moe DOWN_WALK), each beside the default")
    ap.add_argument("--l2-weights", action="store_true",
                    help="with --only-table: the default and each --walk form again with every expert expert 0's bytes")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of timing, each form once a round, order rotated")
    a = ap.parse_args()
    if a.l2_weights and not a.only_table:
        ap.error("--l2-weights needs --only-table")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    w13 = [nv.quantize_nvfp4(torch.randn(2 * a.i, a.h, device=dev) * 0.02) for _ in range(a.e)]
    w2 = [nv.quantize_nvfp4(torch.randn(a.h, a.i, device=dev) * 0.02) for _ in range(a.e)]
    ids = torch.stack([torch.randperm(a.e, device=dev)[:a.k] for _ in range(a.m)])
    rw = torch.rand(a.m, a.k, device=dev)
    x = torch.randn(a.m, a.h, device=dev, dtype=torch.bfloat16)
    hit = torch.unique(ids)
    cids = torch.searchsorted(hit, ids)
    read_gbps = read_bandwidth_gbps()
    gemm_read_us = tuple(hit.numel() * nv.nvfp4_bytes(n, k) / read_gbps / 1e3 for n, k in ((2 * a.i, a.h), (a.h, a.i)))
    read_us = sum(gemm_read_us)
    print(f"M={a.m} top_k={a.k} {a.h}x{a.i}: {hit.numel()} of {a.e} experts hit, their bytes at {read_gbps / 1e3:.2f} "
          f"TB/s (this card's read, measured) "
          f"{read_us:.1f} us (gate_up 2/3 of it)", flush=True)
    flusher = L2Flusher("cuda")
    if a.only_table:
        builds = {"all experts": (w13, w2, ids)}
        if a.l2_weights:
            builds["expert 0's weights (in L2)"] = ([w13[0]] * a.e, [w2[0]] * a.e, ids)
    else:
        builds = {
            "all experts, int64 ids": (w13, w2, ids),
            "all experts, int32 ids": (w13, w2, ids.int()),
            "hit experts, compact ids": ([w13[j] for j in hit.tolist()], [w2[j] for j in hit.tolist()], cids),
        }
    counts = torch.bincount(ids.flatten(), minlength=a.e)
    used_blocks = int(((counts + 7) // 8).sum())
    variants = [(name, build, {}) for name, build in builds.items()]
    if a.variants:  # the launch-early trigger off, and the GEMMs' grid cut to the blocks this routing fills
        variants += [("all experts, no early launch", builds["all experts"], {"deps": False}),
                     (f"all experts, grid of the {used_blocks} blocks filled", builds["all experts"], {"nb": 1})]
    for split in a.split13:
        variants.append((f"all experts, gate_up split {split}", builds["all experts"], {"split13": split}))
    for gemms in a.pair:
        opt = {"pair": gemms, "split2": a.split2 or None}
        variants.append((f"all experts, {gemms} two tiles a warp" + (f", down split {a.split2}" if a.split2 else ""),
                         builds["all experts"], opt))
    for bm in a.block_m:
        for gemms in a.pair or [None]:
            variants.append((f"all experts, blocks of {bm}" + (f", {gemms} two tiles a warp" if gemms else ""),
                             builds["all experts"],
                             {"block_m": bm, "pair": gemms}))
    for walk in a.walk:
        for build in [b for b in ("all experts", "expert 0's weights (in L2)") if b in builds]:
            variants.append((f"{build}, down walking {walk} tile groups a program", builds[build],
                             {"pair": "both" if "both" in a.pair else "down", "walk2": walk}))
    if a.l2_weights:
        variants.append(("expert 0's weights (in L2)", builds["expert 0's weights (in L2)"], {}))
    if a.down_by_pair:
        variants.append(("all experts, down by pair", builds["all experts"], {"down_by_pair": True}))
    for rank in a.align:
        variants.append((f"all experts, align by {rank}", builds["all experts"], {"align_rank": rank}))
    stacks: dict[int, tuple] = {}  # each build's stacks, shared by its forms (the bf16 form's layout, gate_up's copy)
    forms, runs = {}, {}
    for name, (a13, a2, use), opt in variants:
        if id(a13) not in stacks and all(w is a13[0] for w in a13):  # one expert's stacks, stride 0 over the table
            s13, s2 = fp4moe.gate_up_stack(lp._stack_mma(a13[:1], bx=True)), lp._stack_mma(a2[:1], bx=True)
            s13, s2 = (tuple(t.expand(a.e, *t.shape[1:]) for t in s[:2]) + (s[2].expand(a.e).contiguous(),)
                       for s in (s13, s2))
            stacks[id(a13)] = (fp4moe.GateUpStack(*s13), s2)
        elif id(a13) not in stacks:
            stacks[id(a13)] = (fp4moe.gate_up_stack(lp._stack_mma(a13, bx=True)), lp._stack_mma(a2, bx=True))
        s13, s2 = stacks[id(a13)]
        moe = fp4moe.Nvfp4FusedMoe(s13, s2, a.m, a.k, dev, deps=opt.get("deps"), split13=opt.get("split13"),
                                   split2=opt.get("split2"), pair=opt.get("pair"), align_rank=opt.get("align_rank"),
                                   block_m=opt.get("block_m"), down_by_pair=opt.get("down_by_pair"),
                                   walk2=opt.get("walk2"))
        if opt.get("nb") and moe.block_m == 8:
            moe.nb = used_blocks  # the GEMMs' grids only (the align still fills every block's slot)
        print(f"{name}: e {moe.e} nb {moe.nb} block_m {moe.block_m} plan13 {moe.plan13} plan2 {moe.plan2} "
              f"silu_epi {moe.silu_epilogue} cast_epi {moe.cast_epilogue} kernels {moe.kernels} deps {moe.deps}",
              flush=True)
        run = (lambda moe=moe, use=use: moe(x, use, rw))
        if not opt.get("nb"):  # (a cut grid skips blocks the align filled: no whole result to check)
            print(f"  check: {checked(run, a13, a2, x, use, rw)}", flush=True)
        run()
        forms[name], runs[name] = capture_graph([run]), run
    samples = rotated(lambda replay: time_cuda(replay, 3, 10, flusher), {n: g.replay for n, g in forms.items()},
                      a.rounds)
    for name, run in runs.items():
        t = spread(samples[name])
        print(f"{name}: graph {t['median_ms'] * 1e3:.1f} us (min {t['min_ms'] * 1e3:.1f}, p99 "
              f"{t['p99_ms'] * 1e3:.1f}, {len(samples[name])} replays in {a.rounds} rotated rounds); kernels: "
              f"{kernel_times(run, gemm_read_us)}", flush=True)


if __name__ == "__main__":
    main()
