"""Probe (H200): an NVFP4 weight-only GEMM for M = 9-16 with the operands swapped ("swap AB", as vLLM's Machete and
CUTLASS's mixed-input GEMMs do): the dequantised weight tile is the big M side of a Hopper wgmma, from registers, and
x the small N=16 side, from shared memory: acc[BLOCK_N, 16] += tl.dot(w[BLOCK_N, BLOCK_K/4], x_plane[BLOCK_K/4, 16]).

    TRITON_INTERPRET=1 PYTHONPATH=workflow python3 benchmarks/device/swapab_probe.py selfcheck   # CPU, interpreter
    PYTHONPATH=workflow python3 benchmarks/device/swapab_probe.py [M ...]     # GPU; default M = 16 12 8 4 1
    PYTHONPATH=workflow python3 benchmarks/device/swapab_probe.py compile [BN,BK,WARPS,STAGES ...]  # sm_90, no GPU

Why: the default (lowprec.Nvfp4Gemv, mma.sync m16n8k16 from inline asm) reaches 0.58 of read bandwidth at M=16 on
28672x4096 (25.7 us against 19.1 for a plain read of the bytes). Here Triton places the loads: the packed weight,
its scales and x go to shared memory by cp.async, software-pipelined over `stages` K steps, and the weight is read
back straight into the wgmma A-fragment layout (ldmatrix; no layout conversion of the decoded tile).

Kernel (one launch a call; CUDA-graph capturable):
- the packed weight is read as int16 elements of 4 values: element e of a row holds values 4e..4e+3. Plane j (one
  value of every element, 4e + 3 - j) is one dot against x's values at the same places, so there is no
  re-interleaving: four dots of K = BLOCK_K/4 a step. x's four planes come from one [16, BLOCK_K] load a step, split
  in registers and converted to fp16 (no torch op before the kernel: one launch).
- the weight is repacked once (`repack`, as servers repack at load time; the same bytes): within each 16-bit
  element the bits move to the default GEMV's layout (lowprec.mma_bit_layout), where 11 operations (inline asm) turn
  two elements (a register) into the four planes as f16 pairs = E2M1 x 2^-14, exact (e = 0 on fp16's subnormals),
  each pair already what a wgmma A register holds (element a low, b high). Times the E4M3 block scale in fp16 (exact:
  at most 6 significant bits, >= 2^-24), broadcast from [BLOCK_N, BLOCK_K/16] by a reshape that Triton keeps in
  registers. The accumulator is fp32; 2^14 x the tensor scale at the end.
- x rows past M load as zeros (the wgmma's N is 16 whatever M is); x goes to fp16 (an |x| above 65504 would not fit).
- split-K over grid dim 1 (`split`): fp32 atomics into a [M, N] buffer, and the last split of a column tile (a
  counter) casts it to bf16 and leaves zeros (lowprec._split_finish's pattern: no kernel before or after).
- TRITON_INTERPRET=1: the same bit operations in Triton ops per element and the dots in fp32 ("ieee"), since the
  interpreter has no inline asm and mishandles 16-bit dots.

The device mode, per shape: each form's registers, shared memory and programs an SM (from its compile), whence its
K splits (about one and two waves); then per M every config checked against nv.reference_mm's dequantise-then-matmul
(3 calls, x redrawn each), and the configs that pass timed beside the default lp.Nvfp4Gemv and a plain read of the
same bytes: CUDA-graph replay over weight copies larger than twice the L2 (lowprec_device.best_of), one line each:
us, the fraction of read bandwidth (NVFP4 bytes / time / read) and of the plain read's time.

Compiled for sm_90 without a GPU (compile mode, Triton 3.9): every config's four dots are wgmma (TTGIR
ttng.warp_group_dot, PTX wgmma.mma_async m64n16k16 f16) with the decoded weight as the A operand from registers and
x's plane from shared memory; the loop is ldmatrix -> 11-operation decode -> mul.f16x2 by the scale -> wgmma, with no
layout conversion of the weight; 108-189 registers, no spills; 5.8-7.4 SASS instructions a weight byte in the loop
(decode 2.75, scale multiply 1, x's split and fp16 conversion about 0.45 at BLOCK_N=128, scale loads about 0.5).
At 4.4 TB/s an H200 SM can issue about 7 thread instructions a byte (4 warp instructions a cycle at about 1.9 GHz),
so this form too may be bounded by issue rather than by HBM: the timing decides.

Results (2026-12-03, H200, read 4385 GB/s, M = 16 8 1; left out: it lost every shape and M timed). Best of the
swapped forms / the default lp.Nvfp4Gemv / a plain read, us: 24576x6144 M=16 39.5 / 31.5 / 24.1, M=8 39.4 / 22.7 /
24.0, M=1 39.5 / 22.1 / 23.9; 128256x4096 M=16 112.9 / 88.9 / 77.4, M=8 113.0 / 81.6 / 77.3, M=1 113.0 / 74.1 / 76.4.
The swapped forms take the same time at every M (0.44-0.59 of read bandwidth): the loop is bound by issue (5.8-7.4
instructions a weight byte against about 7 an SM can issue at 4.4 TB/s, and Triton waits on each register-A wgmma
before the next step), not by the bytes. Two split forms failed their check at M=8 on 24576x6144 (BN=128 BK=256 8
warps split 2: rel. error 5.1e-2; BN=64 BK=256 4 warps split 2: 3.6e-2; the same forms passed at M = 16 and 1, and
every form passed on the CPU): the split-K finish is not race-free as written here, and was not debugged.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_gap.kernels import lowprec as lp  # noqa: E402
from decode_gap.kernels import nvfp4 as nv  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
UNSCALE = 16384.0  # the decode gives E2M1 x 2^-14 (lp.FP4_UNSCALE)
# Plane j of an element (value 4e + 3 - j, packed at bits 12 - 4j) is repacked with its E2M1 magnitude at bits
# MAG_BITS[j] and its sign at SIGN_BITS[j] (lowprec's MMA_MAG_BITS / MMA_SIGN_BITS): then one AND (plane 0), a shift
# and an AND (plane 1) or two of each and an OR (planes 2, 3) leave fp16's sign at 15 and e1 e0 m at 11..9.
MAG_BITS, SIGN_BITS = (9, 6, 3, 0), (15, 12, 13, 14)

# $0..$3: planes 0..3 as f16x2 (element a in the low half, b in the high half, the pair a wgmma A register holds);
# $4: elements a | b << 16 (Triton packs two int16 a register). 11 operations for 8 values.
_DECODE_ASM = tl.constexpr("""{
.reg .b32 t, u;
and.b32 $0, $4, 0x8E008E00;
shl.b32 t, $4, 3;
and.b32 $1, t, 0x8E008E00;
shl.b32 t, $4, 6;
and.b32 t, t, 0x0E000E00;
shl.b32 u, $4, 2;
and.b32 u, u, 0x80008000;
or.b32 $2, t, u;
shl.b32 t, $4, 9;
and.b32 t, t, 0x0E000E00;
shl.b32 u, $4, 1;
and.b32 u, u, 0x80008000;
or.b32 $3, t, u;
}""")


@triton.jit
def _plane(w, J: tl.constexpr):
    """Plane J of repacked int16 elements as fp16 = E2M1 x 2^-14: the asm's operations on one element."""
    e = w.to(tl.int32) & 0xFFFF
    if J == 0:
        h = e & 0x8E00
    elif J == 1:
        h = (e << 3) & 0x8E00
    elif J == 2:
        h = ((e << 6) & 0x0E00) | ((e << 2) & 0x8000)
    else:
        h = ((e << 9) & 0x0E00) | ((e << 1) & 0x8000)
    return h.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _decode(w, ASM: tl.constexpr):
    if ASM:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,=r,=r,r", [w], dtype=(tl.float16,) * 4,
                                                   is_pure=True, pack=2)
    else:
        p0 = _plane(w, 0)
        p1 = _plane(w, 1)
        p2 = _plane(w, 2)
        p3 = _plane(w, 3)
    return p0, p1, p2, p3


@triton.jit
def _plane_dot(p, s, xp, acc, BLOCK_N: tl.constexpr, G: tl.constexpr, Q: tl.constexpr, ASM: tl.constexpr):
    # 4 elements (16 values) share a block scale: broadcast [BLOCK_N, G] over them by a reshape
    w = tl.reshape(tl.reshape(p, (BLOCK_N, G, 4)) * s[:, :, None], (BLOCK_N, Q))
    if ASM:
        return tl.dot(w, tl.trans(xp), acc)
    return tl.dot(w.to(tl.float32), tl.trans(xp).to(tl.float32), acc, input_precision="ieee")


@triton.jit(do_not_specialize=["M", "steps", "steps_per_split", "split"])  # fewer compiles across shapes and M
def _swapab_kernel(x_ptr, w_ptr, s_ptr, ts_ptr, out_ptr, acc_ptr, cnt_ptr, M, N, steps, steps_per_split, split,
                   stride_xm, stride_w, stride_s, stride_om,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr, EVEN_N: tl.constexpr,
                   ASM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    Q: tl.constexpr = BLOCK_K // 4  # int16 elements a row a step
    G: tl.constexpr = BLOCK_K // 16  # block scales a row a step
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, 16)
    nmask = offs_n[:, None] < N
    wp = w_ptr + offs_n[:, None] * stride_w + tl.arange(0, Q)[None, :]
    sp = s_ptr + offs_n[:, None] * stride_s + tl.arange(0, G)[None, :]
    xp = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    xmask = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    i0 = pid_s * steps_per_split
    # offsets as i * constexpr (not k // 2): the compiler then knows them 16-byte aligned (cp.async of 16 bytes)
    for i in range(i0, tl.minimum(i0 + steps_per_split, steps)):
        if EVEN_N:
            w = tl.load(wp + i * Q)
            s = tl.load(sp + i * G)
        else:
            w = tl.load(wp + i * Q, mask=nmask, other=0)
            s = tl.load(sp + i * G, mask=nmask, other=0.0)
        s = s.to(tl.float16)
        x = tl.load(xp + i * BLOCK_K, mask=xmask, other=0.0).to(tl.float16)
        # x[:, 4e + 2a + b] -> xv for v = 2a + b (split takes the last dim: b first, then a)
        xb0, xb1 = tl.split(tl.reshape(x, (16, Q, 2, 2)))
        x0, x2 = tl.split(xb0)
        x1, x3 = tl.split(xb1)
        p0, p1, p2, p3 = _decode(w, ASM)  # plane j: values 4e + 3 - j
        acc = _plane_dot(p0, s, x3, acc, BLOCK_N, G, Q, ASM)
        acc = _plane_dot(p1, s, x2, acc, BLOCK_N, G, Q, ASM)
        acc = _plane_dot(p2, s, x1, acc, BLOCK_N, G, Q, ASM)
        acc = _plane_dot(p3, s, x0, acc, BLOCK_N, G, Q, ASM)
    acc = acc * (tl.load(ts_ptr) * 16384.0)  # UNSCALE
    om = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    fp = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]  # out[m, n] = acc[n, m]
    if ATOMIC:  # K split: lowprec._split_finish's pattern (the split that completes the tile casts and clears)
        op = acc_ptr + offs_m[None, :] * N + offs_n[:, None]
        tl.atomic_add(op, acc, mask=om, sem="relaxed")
        tl.debug_barrier()  # every thread's sums are in before one thread's acq_rel add releases them
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == split - 1:
            tot = tl.load(op, mask=om, other=0.0, cache_modifier=".cg")  # from L2, where the atomics went
            tl.store(fp, tot.to(out_ptr.dtype.element_ty), mask=om)
            tl.store(op, tl.zeros_like(tot), mask=om)
            tl.store(cnt_ptr + pid_n, 0)
    else:
        tl.store(fp, acc.to(out_ptr.dtype.element_ty), mask=om)


def repack(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] packed bytes -> [N, K/4] int16 in the decode's bit layout (MAG_BITS, SIGN_BITS)."""
    e = packed.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    out = torch.zeros_like(e)
    for j in range(4):
        nib = (e >> (12 - 4 * j)) & 0xF
        out |= ((nib & 7) << MAG_BITS[j]) | ((nib >> 3) << SIGN_BITS[j])
    return torch.where(out >= 2**15, out - 2**16, out).to(torch.int16)


def repacked(q: nv.NVFP4Tensor) -> torch.Tensor:
    """repack(q.packed), made once a weight (kept on q) and shared by every config built on it."""
    if getattr(q, "_swapab_words", None) is None:
        q._swapab_words = repack(q.packed)
    return q._swapab_words


class SwapAbGemm:
    """y[m, N] = x[m, K] @ W^T, W in NVFP4 (1 <= m <= 16, K % block_k == 0). Buffers are allocated once, so a call
    is graph-capturable; with split > 1 the fp32 sums and counters clean up after themselves."""

    def __init__(self, q: nv.NVFP4Tensor, m: int, device, block_n: int = 128, block_k: int = 256, warps: int = 4,
                 stages: int = 3, split: int = 1):
        n, k = q.shape
        if not 1 <= m <= 16 or k % block_k or block_k < 64:
            raise ValueError(f"swapab: needs 1 <= M <= 16 and K % BLOCK_K == 0, BLOCK_K >= 64 (M={m}, K={k}, "
                             f"BLOCK_K={block_k})")
        self.m, self.n, self.k = m, n, k
        self.block_n, self.block_k, self.warps, self.stages = block_n, block_k, warps, stages
        self.w = repacked(q)  # [N, K/4] int16
        self.s, self.ts = q.block_scales, q.tensor_scale
        self.steps = k // block_k
        per = math.ceil(self.steps / max(1, min(split, self.steps)))
        self.per, self.split = per, math.ceil(self.steps / per)
        self.grid = (math.ceil(n / block_n), self.split)
        self.out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        self.acc = torch.zeros((m, n), dtype=torch.float32, device=device) if self.split > 1 else self.out
        self.cnt = torch.zeros(self.grid[0], dtype=torch.int32, device=device)

    @property
    def name(self) -> str:
        return f"BN={self.block_n} BK={self.block_k} w{self.warps} s{self.stages} split={self.split}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        self.compiled = _swapab_kernel[self.grid](
            x, self.w, self.s, self.ts, self.out, self.acc, self.cnt, self.m, self.n, self.steps, self.per,
            self.split, x.stride(0), self.w.stride(0), self.s.stride(0), self.out.stride(0),
            BLOCK_N=self.block_n, BLOCK_K=self.block_k, ATOMIC=self.split > 1, EVEN_N=self.n % self.block_n == 0,
            ASM=not INTERPRET, num_warps=self.warps, num_stages=self.stages)
        return self.out


# --------------------------------------------------------------------------- configs

# (block_n, block_k, warps, stages). sm_90 (compile mode, Triton 3.9): registers, shared memory, SASS instructions of
# the main loop a weight byte, programs an SM: (128, 256, 4, 3) 183, 60 KB, 5.98, 2; (128, 128, 4, 4) 108, 43 KB,
# 6.33, 4; (256, 128, 8, 4) 112, 70 KB, 6.16, 2; (128, 256, 8, 4) 112, 86 KB, 6.84, 2; (256, 256, 8, 3) 182, 96 KB,
# 5.82, 1; (64, 256, 4, 4) 109, 59 KB, 7.36, 3. At 4.4 TB/s an H200 SM issues about 7 instructions a byte, so
# these are near the issue limit: the fewest instructions a byte against the most warps to hide latency.
BASE = [(128, 256, 4, 3), (128, 128, 4, 4), (256, 128, 8, 4), (128, 256, 8, 4), (256, 256, 8, 3), (64, 256, 4, 4)]


def splits_for(tiles: int, steps: int, slots: int) -> list[int]:
    """K splits that make about one and about two waves of programs (`slots`: resident programs on the GPU);
    1 where the column tiles alone fill a wave."""
    return sorted({max(1, min(steps, r * slots // tiles)) for r in (1, 2)})


def cfg_name(c: dict) -> str:
    return f"swapab BN={c['block_n']} BK={c['block_k']} w{c['warps']} s{c['stages']} split={c['split']}"


# --------------------------------------------------------------------------- CPU check (interpreter)


def emulate_decode_asm(elems: torch.Tensor) -> torch.Tensor:
    """The decode asm run in Python on repacked int16 elements (pairs in a register as Triton packs them: a | b << 16):
    [4, ...] fp16 planes, to check its bit operations and output order without a GPU."""
    e = elems.to(torch.int64) & 0xFFFF
    regs = {"$4": e[0::2] | (e[1::2] << 16)}
    ops = {"shl": lambda x, y: (x << y) & 0xFFFFFFFF, "and": lambda x, y: x & y, "or": lambda x, y: x | y}
    for line in _DECODE_ASM.value.splitlines():
        mm = re.match(r"(shl|and|or)\.b32 (\S+), (\S+), (\S+);", line.strip())
        if mm:
            op, d, x, y = mm.groups()
            regs[d] = ops[op](regs[x], regs[y] if y in regs else int(y, 0))
    halves = [torch.stack((regs[f"${j}"] & 0xFFFF, regs[f"${j}"] >> 16), dim=-1).flatten(-2) for j in range(4)]
    return torch.stack(halves).to(torch.int32).to(torch.int16).view(torch.float16)


def selfcheck() -> int:
    if not INTERPRET:
        print("selfcheck runs under TRITON_INTERPRET=1 (CPU)")
        return 2
    torch.manual_seed(0)
    bad = 0
    # the repack and the asm's bit operations against the E2M1 table, on every int16 pattern
    elems = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    planes = emulate_decode_asm(repack(elems.view(torch.uint8))).float() * UNSCALE
    codes = elems.to(torch.int64) & 0xFFFF
    want = torch.stack([nv.e2m1_to_float((codes >> (12 - 4 * j)) & 0xF) for j in range(4)])  # plane j: value 3 - j
    ok = torch.equal(planes, want)
    bad += not ok
    print(f"decode asm (emulated) on all 65536 elements: {'ok' if ok else 'FAILED'}")
    cfgs = [dict(block_n=64, block_k=128, warps=4, stages=2, split=1), dict(block_n=64, block_k=64, warps=4,
                                                                          stages=3, split=3),
            dict(block_n=128, block_k=256, warps=8, stages=3, split=2)]
    for n, k in ((96, 256), (128, 512), (64, 1024)):
        w = torch.randn((n, k))
        q = nv.quantize_nvfp4(w)
        for m in (1, 9, 16):
            x = torch.randn((m, k)).to(torch.bfloat16)
            ref = nv.reference_mm(x, q)
            for c in cfgs:
                g = SwapAbGemm(q, m, "cpu", **c)
                errs = []
                for _ in range(2):  # twice: the split's sums and counters must come back zeroed
                    errs.append(nv.relative_error(g(x).float(), ref))
                clean = g.split == 1 or not (g.acc.any() or g.cnt.any())  # the split's sums and counters zeroed
                good = max(errs) < 2e-2 and clean
                bad += not good
                print(f"N={n:<4} K={k:<5} M={m:<2} {g.name:<34} rel err {max(errs):.2e} {'ok' if good else 'FAILED'}")
    print("selfcheck:", "all ok" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


# --------------------------------------------------------------------------- sm_90 compile without a GPU


def compile_report(base=None, arch: int = 90) -> None:
    """Compile configs for sm_`arch` (Triton's own ptxas, no GPU): registers, spills, shared memory, whether the
    dots became wgmma (TTGIR `warp_group_dot`) with the weight from registers, and the loop's SASS length."""
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _swapab_kernel
    pointers = {"x_ptr": "*bf16", "w_ptr": "*i16", "s_ptr": "*fp8e4nv", "ts_ptr": "*fp32", "out_ptr": "*bf16",
                "acc_ptr": "*fp32", "cnt_ptr": "*i32"}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; set so that it does not warn
    print(f"triton {triton.__version__}, sm_{arch}")
    for bn, bk, warps, stages in base or BASE:
        for atomic in (False, True):
            const = dict(BLOCK_N=bn, BLOCK_K=bk, ATOMIC=atomic, EVEN_N=True, ASM=True)
            sig = {a: pointers.get(a, "i32") for a in fn.arg_names}
            sig.update({a: "constexpr" for a in const})
            # as the runtime specialises model shapes: 16-byte-aligned pointers, integers but M multiples of 16
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                     if a not in const and a not in ("M", "steps", "steps_per_split", "split")}
            src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(a),): v for a, v in const.items()},
                            attrs=attrs)
            name = f"BN={bn} BK={bk} w{warps} s{stages}{' split' if atomic else ''}"
            try:
                t0 = time.time()
                kern = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": warps, "num_stages": stages})
                dt = time.time() - t0
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(kern.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True,
                                           check=True).stdout
                    sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                                          check=True).stdout
            except Exception as exc:  # a config that does not compile is a finding
                print(f"{name:<34} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            regs = re.search(r"REG:(\d+)", usage).group(1)
            spill = re.search(r"STACK:(\d+)", usage).group(1)
            ttgir = kern.asm["ttgir"]
            wgmma = ttgir.count("ttng.warp_group_dot ")
            a_regs = len(re.findall(r"warp_group_dot %\S+, %\S+, %\S+ \{[^}]*\} : tensor<", ttgir))
            print(f"{name:<34} regs {regs:>3} stack {spill:>3} shared {kern.metadata.shared:>6} B  "
                  f"wgmma {wgmma} (A from registers: {a_regs})  mma.sync {ttgir.count('tt.dot ')}  "
                  f"HGMMA in SASS {sass.count('HGMMA')}  loop instructions {loop_length(sass)}  ({dt:.1f} s)")


def loop_length(sass: str) -> int:
    """Instructions of the longest backward branch's body (the main loop)."""
    rows = [(int(a, 16), body) for a, body in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    best = 0
    for addr, body in rows:
        mm = re.search(r"BRA\s.*?0x([0-9a-f]+)", body)
        if mm and int(mm.group(1), 16) < addr:
            best = max(best, sum(1 for a, _ in rows if int(mm.group(1), 16) <= a <= addr))
    return best


# --------------------------------------------------------------------------- device sweep

SHAPES = [(28672, 4096), (6144, 4096), (4096, 4096), (4096, 14336), (36864, 7168), (7168, 18432), (24576, 6144),
          (128256, 4096)]


def sweep(ms: list[int], dev=None, shapes=SHAPES) -> None:
    """The device mode (dev cuda); on a CPU host under TRITON_INTERPRET=1 with tiny shapes, a smoke test of it."""
    import lowprec_device as ld
    from decode_gap.microbench import memory
    from decode_gap.microbench.common import BenchEnv

    t0 = time.time()
    dev = torch.device(dev or "cuda")
    sms = lp.sm_count(dev)
    env = BenchEnv(device=dev, warmup=3, iters=30, cpu_budget_s=0.05)
    read = memory.measure_memory(env)["read_gbps"]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"read {read:.0f} GB/s, {sms} SMs, {name}, triton {triton.__version__}", flush=True)
    for n, k in shapes:
        q = nv.quantize_nvfp4(torch.randn((n, k), device=dev, dtype=torch.bfloat16))
        deq = nv.dequantize_nvfp4(q)  # nv.reference_mm's dequantisation, once a shape
        qs = ld.nvfp4_copies(q, dev)
        nb = nv.nvfp4_bytes(n, k)
        cfgs = []
        for bn, bk, warps, stages in BASE:  # the K splits from each form's compiled residency
            if k % bk:
                continue
            c = dict(block_n=bn, block_k=bk, warps=warps, stages=stages, split=1)
            try:
                g = SwapAbGemm(q, 16, dev, **c)
                g(torch.zeros((16, k), device=dev, dtype=torch.bfloat16))
                fits = lp.resident_programs(g.compiled, warps, dev) or 1
            except Exception as exc:
                print(f"{n}x{k} {cfg_name(c)}: error {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            splits = splits_for(g.grid[0], g.steps, fits * sms)
            shared = getattr(getattr(g.compiled, "metadata", None), "shared", None)
            print(f"{n}x{k} BN={bn} BK={bk} w{warps} s{stages}: {getattr(g.compiled, 'n_regs', None)} registers, "
                  f"{shared} B shared, {fits} programs an SM, {g.grid[0]} column tiles, splits {splits}", flush=True)
            cfgs += [dict(c, split=sp) for sp in splits]
        for m in ms:
            x = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
            ok = []
            for c in cfgs:  # correctness first: a config that fails is not timed
                try:
                    g = SwapAbGemm(q, m, dev, **c)
                    errs = []
                    for _ in range(3):  # x redrawn each call: sums a split left behind would show
                        x.normal_()
                        errs.append(nv.relative_error(g(x), x.float() @ deq.t()))
                    good = max(errs) < 2e-2
                    print(f"check {n}x{k} M={m} {cfg_name(c)}: rel err {max(errs):.2e} {'ok' if good else 'FAILED'}",
                          flush=True)
                    ok += [c] if good else []
                except Exception as exc:
                    print(f"check {n}x{k} M={m} {cfg_name(c)}: error {type(exc).__name__}: {str(exc)[:200]}",
                          flush=True)
            builders = {cfg_name(c): (lambda c=c: [(lambda g=g: g(x)) for g in [SwapAbGemm(qq, m, dev, **c)
                                                                                 for qq in qs]]) for c in ok}
            builders["lp.Nvfp4Gemv default"] = lambda: [(lambda g=g: g(x)) for g in [lp.Nvfp4Gemv(qq, m, dev)
                                                                                      for qq in qs]]
            best, _, times = ld.best_of(env, builders, ld.nvfp4_call_bytes(n, k, m))
            plain = ld.plain_read_us(env, ld.nvfp4_call_bytes(n, k, m))
            times["plain read"] = plain
            for name, us in times.items():
                if isinstance(us, float):
                    of_plain = f"  {plain / us:.2f} of plain read" if plain else ""
                    print(f"{n:>6}x{k:<6} M={m:<2} {name:<44} {us:8.2f} us  {nb / (us * 1e-6) / (read * 1e9):.2f} r"
                          f"{of_plain}{'  <- best' if name == best else ''}", flush=True)
                else:
                    print(f"{n:>6}x{k:<6} M={m:<2} {name:<44} error: {ld.RESULTS['errors'].get(name, us)}", flush=True)
        qs = q = deq = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[{time.time() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["selfcheck"]:
        sys.exit(selfcheck())
    elif sys.argv[1:2] == ["compile"]:  # optional configs as BN,BK,WARPS,STAGES
        compile_report([tuple(int(v) for v in a.split(",")) for a in sys.argv[2:]])
    else:
        sweep([int(a) for a in sys.argv[1:]] or [16, 12, 8, 4, 1])
