"""Probe (H200): the DSA indexer's top-k (2048 of T fp32 scores) by torch.topk (sorted and unsorted), the one-program
radix select (T <= topk.MAX_ROW, or past it by up to MAX_TAIL with a tail block) and the multi-pass radix select at
several chunk sizes, with and without programmatic dependent launch, and in one launch (its chunks meeting at a barrier
after each pass) where they are all resident; every result checked against torch.topk's scores, on random scores and
on scores rounded to a few values (ties at the threshold across chunks). CUDA-graph replay over rotating copies of
the scores (median us). The pairwise rank (rows up to topk.RANK_MAX) at the blocks --rank names.

    PYTHONPATH=workflow python3 benchmarks/device/topk_probe.py [--rows 1,8] [--lengths 4096,...] [--chunks 1024,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402

from decode_gap.kernels import topk  # noqa: E402
from decode_gap.microbench.timing import rotating_copies, time_graph  # noqa: E402


def one_program(s: torch.Tensor, k: int, bits: int) -> torch.Tensor:
    """topk.topk_indices' one-program launch with `bits`-bit digits."""
    m, t = s.shape
    out = torch.empty((m, k), dtype=torch.int32, device=s.device)
    block = max(2048, 1 << (t - 1).bit_length())
    topk._topk_kernel[(m,)](s, out, t, k, s.stride(0), out.stride(0), BITS=bits, BLOCK_T=block,
                            num_warps=block // (32 * topk.PER_THREAD))
    return out


def synced_arrivals(m: int, t: int, k: int, chunk: int, digit: int, dev) -> str:
    """The one-launch form's barrier counters after a call: each row's must read chunks x the passes it ran (a
    program's arrival counted once, by one thread; random scores stop after 3 of 4 8-bit passes)."""
    s = torch.randn((m, t), device=dev)
    counts, out = topk._counts(m, digit, dev), torch.empty((m, k), dtype=torch.int32, device=dev)
    chunks, passes = -(-t // chunk), topk._passes(digit)
    topk._topk_synced_kernel[(m, chunks)](s, counts, out, t, k, chunks, s.stride(0), counts.stride(0), out.stride(0),
                                          PASSES=passes, DIGIT=digit, CHUNK=chunk, ZERO=False,
                                          num_warps=topk._warps(chunk))
    got = counts[:, passes * (1 << digit) + 2].tolist()
    ok = all(a % chunks == 0 and 0 < a // chunks <= passes for a in got)
    return f"arrivals {got[:4]} ({chunks} chunks, {passes} passes at most){'' if ok else ' WRONG'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--lengths", default="4096,8192,16384,32768,65536,131072")
    ap.add_argument("--chunks", default="512,1024,2048")
    ap.add_argument("--digits", default="8,11")
    ap.add_argument("--pdl", default="0,1", help="the multi-pass form without (0) and with (1) PDL")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rank", default=f"{topk.RANK_BLOCK_I}x{topk.RANK_BLOCK_J}",
                    help="the pairwise rank's blocks, scores a program x scores an iteration (rows up to RANK_MAX)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    for c in map(int, a.chunks.split(",")):
        fits = topk.synced_fits(8, 32768, dev, c)
        print(f"one launch, 8 rows x 32768, chunk {c}: resident {topk._RESIDENT} an SM; "
              f"{synced_arrivals(8, 32768, a.k, c, 8, dev) if fits else 'does not fit'}", flush=True)
    for m in map(int, a.rows.split(",")):
        for t in map(int, a.lengths.split(",")):
            n = rotating_copies(m * t * 4, dev)
            copies = [torch.randn((m, t), device=dev) for _ in range(n)]
            kept_counts = []
            cands = {"torch sorted": lambda s: torch.topk(s, a.k, dim=-1).indices,
                     "torch unsorted": lambda s: topk.topk_indices_reference(s, a.k)}
            if t <= topk.MAX_ROW:
                for bits in (4, 8):
                    cands[f"radix 1 program {bits}-bit"] = lambda s, bits=bits: one_program(s, a.k, bits)
            if t <= topk.RANK_MAX:
                for blocks in a.rank.split(","):
                    bi, bj = map(int, blocks.split("x"))
                    cands[f"pairwise rank {bi}x{bj}"] = \
                        lambda s, bi=bi, bj=bj: topk.topk_indices_rank(s, a.k, block_i=bi, block_j=bj)
            tail = topk.forms(t).get(topk.TAIL_LABEL)  # just past MAX_ROW: one program with a tail block
            if tail is not None:
                cands["radix 1 program + tail"] = lambda s, tail=tail: tail(s, a.k)
            for c in map(int, a.chunks.split(",")):
                for digit in map(int, a.digits.split(",")):
                    for pdl in (p == "1" for p in a.pdl.split(",")):
                        cands[f"multi-pass {digit}-bit chunk {c}{' pdl' if pdl else ''}"] = \
                            lambda s, c=c, pdl=pdl, digit=digit: topk.topk_indices_multipass(s, a.k, c, pdl, digit)
                    if topk.synced_fits(m, t, dev, c, digit):
                        cands[f"one launch {digit}-bit chunk {c}"] = \
                            lambda s, c=c, digit=digit: topk.topk_indices_synced(s, a.k, c, digit)
                        kept = topk.SyncedSelect(m, dev, digit, c)  # counts kept at zero, no memset; PDL
                        cands[f"one launch kept {digit}-bit chunk {c}"] = lambda s, kept=kept: kept(s, a.k)
                        kept_counts.append(kept.counts)
            cells = []
            ties = copies[0].mul(4).round()  # a few values, so the threshold's ties span chunks
            for name, fn in cands.items():
                ok = True
                for s in (copies[0], ties):
                    got = fn(s)
                    ref = torch.topk(s, a.k, dim=-1).values.sort(dim=-1).values
                    ok &= torch.equal(s.gather(1, got.long()).sort(dim=-1).values, ref)
                    ok &= all(len(set(r)) == a.k for r in got.tolist())
                us = time_graph([lambda fn=fn, x=x: fn(x) for x in copies], 3, 30, dev).median_us
                cells.append(f"{name} {us:.1f}{'' if ok else ' WRONG'}")
            torch.cuda.synchronize()
            dirty = sum(bool(c.any()) for c in kept_counts)  # every call leaves its kept counts at zero
            if kept_counts:
                cells.append(f"kept counts zero after the calls: {'yes' if not dirty else f'NO ({dirty})'}")
            print(f"M={m} T={t} ({n} copies): " + " | ".join(cells), flush=True)
            del copies
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
