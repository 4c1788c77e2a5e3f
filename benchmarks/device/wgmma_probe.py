"""Device probe (issue 14): would a wgmma form of the NVFP4 weight-only GEMM beat fp4wide's mma.sync above 16 rows?

fp4wide decodes each weight into mma.sync operands and reads about half a plain read's speed at 32-64 rows;
benchmarks/wgmma_decode_cost.py counted a tl.dot (wgmma) form at 18.6 instructions a weight byte and left it untimed.
This times the cheaper decode it points to: Triton's tl.dot with the weight as wgmma's 64-row A operand ("swap AB":
y^T = W x^T), in fp16, so the decode is Marlin's shift for sign-magnitude minifloats (read in vLLM's Marlin, written
anew). Two E2M1 values take one 32-bit operation: the sign stays in place and the three other bits shift into an
fp16's exponent and mantissa (the value times 2^-14). The weight's nibbles are repacked once so that a word's shifts
give its 8 values in K order (`repack`). The block scale is multiplied in fp16: every product (E2M1 x E4M3 x 2^-14)
is an exact fp16, subnormal or not (its lowest bit is at least 2^-24); the tensor scale and 2^14 come at the end. x
is cast to fp16 (past 65504 it overflows, a real risk for some models' activations: a probe, not a path). K splits
add fp32 sums with atomics; the call is x's cast, the sums zeroed, the GEMM and the cast to bf16. Each form is
checked against dequantise-then-matmul first; CUDA-graph replay over rotating weight copies (the L2 flushed by the
rotation), beside fp4wide's default, bf16 torch.mm and a plain read.

Compiled for sm_90 (triton 3.9.0): 10.4-10.9 instructions a weight byte at 64 weight rows a program (fp4wide: 7.5),
167-202 registers, 2-3 programs an SM; the decoded tile still goes through shared memory (STS, then LDSM) to reach
wgmma's register operand. Timed on an H100 80GB HBM3 (2026-12-05), us, the best of splits 1-8 and 64 or 128 weight
rows a program, the GEMM alone / fp4wide's whole call / a plain read of the NVFP4 bytes:
- 28672x4096: M=16 61.9 / 38.8 / 24.8, M=32 68.0 / 40.7, M=64 109.7 / 70.6;
- 6144x4096: M=16 17.6 / 12.8 / 6.8, M=32 18.9 / 14.1, M=64 27.6 / 22.2;
- 7168x18432: M=16 66.5 / 42.8 / 28.4, M=32 72.5 / 43.9, M=64 117.2 / 82.4.
Every form checked (1.6-1.7e-3), and each lost to fp4wide by 1.2-1.7x, so fp4wide stays the path above 16 rows.

    PYTHONPATH=workflow python3 benchmarks/device/wgmma_probe.py [M,...] [NxK,...]
    TRITON_INTERPRET=1 PYTHONPATH=workflow python3 benchmarks/device/wgmma_probe.py --check   # CPU: the decode only
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_gap.kernels import nvfp4 as nv  # noqa: E402

PERM = (3, 1, 2, 0, 7, 5, 6, 4)  # the nibble of a word that the kernel's decode gives at K position p of the 8


def repack(q: nv.NVFP4Tensor) -> torch.Tensor:
    """[N, K/8] int32 words: word w's nibble PERM[p] holds the code at K = 8w + p (nibble i at bits 4i-4i+3)."""
    n, k = q.shape
    codes = nv.unpack_e2m1(q.packed).reshape(n, k // 8, 8).to(torch.int64)
    placed = torch.empty_like(codes)
    placed[..., list(PERM)] = codes
    words = (placed << (4 * torch.arange(8, device=codes.device))).sum(-1)
    return words.to(torch.int64).where(words < 2**31, words - 2**32).to(torch.int32).contiguous()


@triton.jit
def _two(p):
    """The two fp16 of a 32-bit word, low half first."""
    return ((p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True),
            (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True))


@triton.jit
def _shifted(q, t: tl.constexpr):
    """Nibbles 3-t and 7-t of each word as fp16 (E2M1 value x 2^-14): sign at bit 15, bits 12-14 shifted to 9-11."""
    p = (q << (4 * t)).to(tl.uint32)
    return _two((p & 0x80008000) | ((p & 0x70007000) >> 3))


@triton.jit
def _wgmma_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_per_split, stride_xm, stride_w, stride_s, stride_om,
                  BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    offs_m = tl.program_id(2) * BM + tl.arange(0, BM)
    k0s = tl.program_id(1) * k_per_split
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    wrow = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    srow = s_ptr + offs_n.to(tl.int64)[:, None] * stride_s
    xcol = x_ptr + tl.minimum(offs_m, M - 1)[None, :] * stride_xm
    for k0 in tl.range(k0s, tl.minimum(k0s + k_per_split, K), BK, num_stages=STAGES):
        q = tl.load(wrow + (k0 // 8 + tl.arange(0, BK // 8))[None, :])
        a0, a1 = _shifted(q, 0)
        b0, b1 = _shifted(q, 1)
        c0, c1 = _shifted(q, 2)
        d0, d1 = _shifted(q, 3)
        w = tl.join(tl.join(tl.join(a0, a1), tl.join(b0, b1)), tl.join(tl.join(c0, c1), tl.join(d0, d1)))
        s = tl.load(srow + (k0 // 16 + tl.arange(0, BK // 16))[None, :]).to(tl.float16)
        w = tl.reshape(tl.reshape(w, (BN, BK // 16, 16)) * s[:, :, None], (BN, BK))
        acc = tl.dot(w, tl.load(xcol + (k0 + tl.arange(0, BK))[:, None]), acc)
    om = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    tl.atomic_add(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc, mask=om, sem="relaxed")


class WgmmaGemm:
    def __init__(self, q: nv.NVFP4Tensor, m: int, split: int, bn: int = 64, bk: int = 256, stages: int = 3):
        self.n, self.k = q.shape
        self.words, self.scales = repack(q), q.block_scales
        self.ts = q.tensor_scale.float() * 16384.0  # the decode's 2^-14
        self.m, self.bn, self.bk, self.stages = m, bn, bk, stages
        self.bm = max(16, min(64, triton.next_power_of_2(m)))
        steps = self.k // bk
        per = -(-steps // split) * bk
        self.kps, self.split = per, -(-self.k // per)
        dev = q.packed.device
        self.sums = torch.zeros((m, self.n), device=dev, dtype=torch.float32)
        self.x16 = torch.empty((m, self.k), device=dev, dtype=torch.float16)

    def gemm(self):
        grid = (self.n // self.bn, self.split, -(-self.m // self.bm))
        _wgmma_kernel[grid](self.x16, self.words, self.scales, self.sums, self.m, self.n, self.k, self.kps,
                            self.x16.stride(0), self.words.stride(0), self.scales.stride(0), self.sums.stride(0),
                            BN=self.bn, BM=self.bm, BK=self.bk, STAGES=self.stages, num_warps=4)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.x16.copy_(x)
        self.sums.zero_()
        self.gemm()
        return (self.sums * self.ts).to(x.dtype)


def check_cpu() -> None:
    torch.manual_seed(0)
    n, k, m = 64, 512, 16
    w = torch.randn((n, k)) * torch.logspace(-3, 1, k)[None, :]
    q = nv.quantize_nvfp4(w)
    x = torch.randn((m, k), dtype=torch.bfloat16)
    g = WgmmaGemm(q, m, split=2, bk=128, stages=1)
    out = g(x)
    err = nv.relative_error(out.float(), nv.reference_mm(x, q))
    print(f"interpreter {m}x{n}x{k}: rel err {err:.1e} {'ok' if err < 1e-2 else 'FAIL'}")


def main() -> None:
    from decode_gap.kernels import fp4wide
    from decode_gap.microbench.common import BenchEnv
    from decode_gap.microbench.launch import PlainReads
    from decode_gap.microbench.timing import rotating_copies, time_graph

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ms = [int(v) for v in args[0].split(",")] if args else [16, 32, 64]
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args[1] if len(args) > 1 else
                                                             "28672x4096,6144x4096,7168x18432").split(",")]
    dev = torch.device("cuda")
    reads = PlainReads(BenchEnv(device=dev, warmup=5, iters=30))
    torch.manual_seed(0)
    for n, k in shapes:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        nb = nv.nvfp4_bytes(n, k)
        wb = torch.randn((n, k), device=dev, dtype=torch.bfloat16)
        qs = [q] + [nv.NVFP4Tensor(q.packed.clone(), q.block_scales.clone(), q.tensor_scale.clone(), q.shape)
                    for _ in range(rotating_copies(nb, dev) - 1)]
        read_us = reads.us(nb) or float("nan")
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            ref = nv.reference_mm(x, q)
            line = [f"{n}x{k} M={m}: read {read_us:.1f}"]
            try:
                gs = [fp4wide.Nvfp4WideGemm(qq, m, dev) for qq in qs]
                err = nv.relative_error(gs[0](x).float(), ref)
                line.append(f"fp4wide {time_graph([lambda g=g: g(x) for g in gs], 3, 20, dev).median_us:.1f} "
                            f"(err {err:.1e})")
            except Exception as e:  # fp4wide takes M > 16 only
                line.append(f"fp4wide: {type(e).__name__} {str(e)[:80]}")
            gs = None
            line.append(f"bf16 torch.mm {time_graph([lambda: torch.mm(x, wb.t())], 3, 20, dev).median_us:.1f} "
                        "(one copy: L2-warm where it fits)")
            for split in (1, 2, 4, 8):
                for bn in (64, 128):
                    try:
                        gs = [WgmmaGemm(qq, m, split, bn=bn) for qq in qs]
                        err = nv.relative_error(gs[0](x).float(), ref)
                        call = time_graph([lambda g=g: g(x) for g in gs], 3, 20, dev).median_us
                        alone = time_graph([g.gemm for g in gs], 3, 20, dev).median_us
                        line.append(f"wgmma bn{bn} s{gs[0].split} {call:.1f} (gemm {alone:.1f}, err {err:.1e}"
                                    f"{'' if err < 1e-2 else ' FAIL'})")
                    except Exception as e:  # a form that does not compile or fit is reported, not fatal
                        line.append(f"wgmma bn{bn} s{split}: {type(e).__name__} {str(e)[:80]}")
                    gs = None
            print("; ".join(line), flush=True)


if __name__ == "__main__":
    check_cpu() if "--check" in sys.argv else main()
