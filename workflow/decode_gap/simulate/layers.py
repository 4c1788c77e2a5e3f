"""Kernel level: random tensors and the linear / routed-expert layers of a decode step in each weight format."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..errors import DecodeGapError
from .formats import FUSED_K_MULTIPLE, GROUPED_GEMV_KINDS, _torch

# bf16 GEMVs of at most NARROW_ROWS rows at M=1 are offered a K block of NARROW_GEMV (rows, values, warps) too:
# more K splits, more programs. H100 (2026-12-06, benchmarks/device/narrow_gemv_probe.py, us), the default block
# (8 rows, 2048 values) / this: 256x6144 (GLM-5's router) 4.69 / 4.41, 256x7168 (DeepSeek-V3's) 5.81 / 4.59, 32x6144
# (GLM-5's indexer head weights) 3.21 / 2.72, 160x5120 5.32 / 3.78; 1024x6144 7.48 / 7.78, so not past 512 rows
NARROW_ROWS = 512
NARROW_GEMV = (8, 512, 4)

# ----------------------------------------------------------------------------------------------------------
# tensors


def _tdtype(name: str):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[name]


# the scale of the unit-normal fp8 values `_rand` makes: weights of std 0.02 as the bf16 ones. Values do not change a
# kernel's time, but they steer the router: with a scale of 1 every linear grew the hidden state about sqrt(K) times,
# and past the first MoE layer a batch of 8 routed to 2 of DeepSeek-V3's experts, not 55 (H200, fp8 batch 8)
FP8_SCALE = 0.02


def _rand(shape, dtype_name: str, device: str, std: float = 0.02):
    """A random tensor; large ones are filled in chunks so fp8 conversion needs little scratch memory."""
    torch = _torch()
    if dtype_name != "fp8":
        t = torch.empty(shape, dtype=_tdtype(dtype_name), device=device)
        return t.normal_(0.0, std)
    t = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    flat = t.view(-1)
    step = 1 << 26
    for i in range(0, flat.numel(), step):
        n = min(step, flat.numel() - i)
        flat[i:i + n] = torch.empty(n, dtype=torch.bfloat16, device=device).normal_(0.0, 1.0).to(torch.float8_e4m3fn)
    return t


def _fp8_weight(shape, device: str, block: bool):
    """A random fp8 weight [..., N, K] with random per-tensor (per expert) or 128x128 block scales (values do not
    matter, shapes and bytes do)."""
    torch = _torch()
    from ..kernels import lowprec as lp

    *lead, n, k = shape
    grid = (*lead, -(-n // lp.FP8_BLOCK), -(-k // lp.FP8_BLOCK)) if block else tuple(lead)
    return lp.Fp8Weight(_rand(shape, "fp8", device), torch.empty(grid, device=device).uniform_(1e-3, 1e-2), block)


class KernelPicker:
    """Times the candidate kernels for one shape once and keeps the fastest, as an engine picks its tactics at
    build. On a GPU each candidate is captured in a CUDA graph and its replays are timed (CUDA events, the L2
    flushed and a sleep kernel queued ahead of each, so the span is the kernel's GPU time and not its launch);
    on a CPU, wall time. The median of `iters` after a warm-up decides. Shapes already timed keep their choice;
    `records` holds every shape's times for the result file. An op whose inputs the kernel before it has just
    written (the DSA indexer's scores into its top-k) is timed with them left in L2 (`inputs_in_l2`), as the step
    runs it. H100, 1 row of 4097 scores, the top-k's tail block: 19.6 us after a flush, 16.6 with the scores in L2,
    15.9 of kernel time inside the step's attention (benchmarks/device/step_profile.py)."""

    SLEEP_CYCLES = 200_000  # ~0.1 ms at H200 clocks: longer than a graph launch takes on the host
    # one call after a flush that leaves the L2 full of dirty lines: slower than the micro-benchmarks' steady state
    # over rotating copies, the same for every candidate, so it ranks them; the gemm stage's figures are the ones
    CLOCK = "CUDA-graph replay of one call after an L2 flush, CUDA events (ranks the candidates)"
    CLOCK_IN_L2 = "CUDA-graph replay of one call, its inputs left in L2 as the kernel before leaves them, CUDA events"

    def __init__(self, device: str, warmup: int = 3, iters: int = 15) -> None:
        from ..timing import L2Flusher

        self.device, self.warmup, self.iters = device, warmup, iters
        self.flush = L2Flusher(device)
        self.chosen: dict[tuple, str] = {}
        self.records: list[dict] = []

    def _time_us(self, fn, flush) -> list[float]:
        from ..timing import capture_graph, graph_spans_us, time_cpu_us

        if not self.device.startswith("cuda"):
            return time_cpu_us(fn, self.warmup, self.iters, flush)
        graph = capture_graph([fn], self.device, self.warmup)
        return graph_spans_us(graph, self.iters, self.SLEEP_CYCLES, flush)

    def pick(self, key: tuple, candidates: dict, inputs_in_l2: bool = False) -> str:
        """The name of the fastest of `candidates` (name -> call) for `key`, timing them the first time; with
        `inputs_in_l2`, without the flush (each replay finds what the last one read still in L2)."""
        if key in self.chosen:
            return self.chosen[key]
        import numpy as np

        flush = None if inputs_in_l2 else self.flush
        times = {name: float(np.median(self._time_us(fn, flush))) for name, fn in candidates.items()}
        best = min(times, key=times.__getitem__)
        self.chosen[key] = best
        what = f"{key[0]} " if isinstance(key[0], str) else ""  # "gqa 1x32x8x128x513": the kind, then its sizes
        sizes = key[1:] if what else key
        self.records.append({"shape": what + "x".join(str(v) for v in sizes), "chosen": best,
                             "us": {n: round(t, 2) for n, t in times.items()},
                             "clock": self._clock(inputs_in_l2)})
        return best

    def _clock(self, inputs_in_l2: bool) -> str:
        if self.device.startswith("cuda"):
            return self.CLOCK_IN_L2 if inputs_in_l2 else self.CLOCK
        return "wall time, inputs in cache" if inputs_in_l2 else "wall time"

    def summary(self, what: str) -> str:
        """One line: how many shapes of each kind (gqa, mla, topk; none for the linears) took each kernel."""
        kinds: dict[str, dict[str, int]] = {}
        for r in self.records:
            counts = kinds.setdefault(r["shape"].rpartition(" ")[0], {})  # "topk 1x4097x2048" -> "topk"; linears ""
            counts[r["chosen"]] = counts.get(r["chosen"], 0) + 1
        parts = []
        for kind, counts in kinds.items():
            total = sum(counts.values())
            parts.append((f"{kind}: " if kind else "")
                         + ", ".join(f"{name} on {n} of {total} shapes" for name, n in counts.items()))
        return f"{what}: " + "; ".join(parts) + " (each shape timed at build: kernel_choices in simulate/kernel.json)"


FP8_MMA = "fp8mma.Fp8MmaGemv"  # the kernel_choices name of our fp8 tensor-core GEMV


class Linear:
    """y = x @ W^T for one weight matrix in the kernel level's dtype for it."""

    def __init__(self, n: int, k: int, kind: str, act: str, device: str, m: int = 1, pad_m: int = 0,
                 picker: KernelPicker | None = None) -> None:
        torch = _torch()
        self.kind = kind
        self.pad_m = pad_m
        self.act_dtype = _tdtype(act)
        if kind == "nvfp4-wo":
            from ..kernels import nvfp4 as nv

            q = nv.quantize_nvfp4(torch.randn(n, k, device=device) * 0.02)
            self.gemm = nv.WeightOnlyGemm(q, m, device, out_dtype=self.act_dtype)
            self.nbytes = nv.nvfp4_bytes(n, k)
            return
        if kind in ("fp8-block", "fp8-gemv"):  # batch 1 (probe_formats): our fp8 GEMV
            from ..kernels import lowprec as lp

            block = kind == "fp8-block"
            w = _fp8_weight((n, k), device, block)
            self.gemm = lp.DenseGemv(w, m, device, out_dtype=self.act_dtype)
            self.nbytes = lp.fp8_bytes(n, k, block)
            if block:
                chosen, mma = self._pick_fp8(picker, ("fp8-block", n, k, m), w, {"lowprec.DenseGemv": self.gemm},
                                             m, k, device)
                if chosen == FP8_MMA:
                    self.gemm = mma
            else:  # per-tensor: torch._scaled_mm on the same bytes is the other candidate
                self.w, self.w_scale, self.one = w.data, w.scales, torch.ones((), device=device)
                chosen, mma = self._pick_fp8(picker, (n, k, m), w, {"lowprec.DenseGemv": self.gemm,
                                                                   "torch._scaled_mm": self._scaled_mm}, m, k, device)
                if chosen == "torch._scaled_mm":
                    self.kind, self.gemm = "fp8", None
                elif chosen == FP8_MMA:
                    self.gemm, self.w = mma, None
            return
        if kind == "fp8-block-mm":  # above batch 1 (probe_formats): x quantised per 1x128 group, cuBLAS blockwise
            from ..kernels import fp8block
            from ..kernels import lowprec as lp

            if not fp8block.refusal(n, k):
                w = _fp8_weight((n, k), device, True)
                self.gemm = fp8block.BlockScaledMm(w, m, device, out_dtype=self.act_dtype)
                self.nbytes = lp.fp8_bytes(n, k, True)
                chosen, mma = self._pick_fp8(picker, ("fp8-block", n, k, m), w,
                                             {"fp8block.BlockScaledMm": self.gemm}, m, k, device)
                if chosen == FP8_MMA:
                    self.gemm = mma
                return
            w = _fp8_weight((n, k), device, True)
            mma = self._fp8_mma(w, m, k, device, picker)
            if mma is not None:  # a shape cuBLAS's blockwise form refuses (K not whole 512s): ours runs the scales
                self.gemm, self.nbytes = mma, lp.fp8_bytes(n, k, True)
                return
            kind = self.kind = "fp8"  # else per-tensor scales on the same bytes
        self.w = _rand((n, k), kind, device)
        self.nbytes = self.w.numel() * self.w.element_size()
        if kind == "fp8":
            self.one = torch.ones((), device=device)
            self.w_scale = torch.full((), FP8_SCALE, device=device)
            from ..kernels import lowprec as lp

            chosen, mma = self._pick_fp8(picker, ("fp8", n, k, m), lp.Fp8Weight(self.w, self.w_scale, False),
                                         {"torch._scaled_mm": self._scaled_mm}, m, k, device)
            if chosen == FP8_MMA:
                self.kind, self.gemm, self.w = "fp8-mma", mma, None
        if kind == "bf16" and picker is not None and device.startswith("cuda") and m == 1:
            self._pick_bf16_gemv(n, k, device, picker)

    def _fp8_mma(self, w, m: int, k: int, device: str, picker: KernelPicker | None):
        """Our fp8 tensor-core GEMV on w (kernels/fp8mma: x in bf16 as it is, per-tensor or block scales), a
        candidate the picker times beside the library's and our CUDA-core GEMV; None where it cannot run here.
        H200 (2026-12-04, benchmarks/device/fp8mma_probe.py, us): DeepSeek-V3 block-scaled 2112x7168 at M = 4 / 8 /
        16 7.1 / 8.0 / 8.5-8.8 against cuBLAS's blockwise 17.0-17.3, 36864x7168 at M = 4 / 16 62.3 / 71.0 against
        87.1 / 83.3, 7168x18432 at M=16 41.3 against 45.0; Llama-3.1-8B per-tensor 4096x14336 at M=4 16.8 against
        `_scaled_mm`'s 19.5; per-tensor 28672x4096 above M=1 ours 30.3-33.3 against `_scaled_mm`'s 30.0-32.6 (runs
        differ on which wins: the picker times both)."""
        if picker is None or not device.startswith("cuda") or m > 16 or self.act_dtype != _torch().bfloat16:
            return None
        from ..kernels import fp8mma

        return fp8mma.Fp8MmaGemv(w, m, device, out_dtype=self.act_dtype) if fp8mma.available(device, k) else None

    def _pick_fp8(self, picker: KernelPicker | None, key: tuple, w, calls: dict, m: int, k: int,
                  device: str) -> tuple[str | None, Any]:
        """The fastest for this shape of calls (name -> a call on x [m, k]) and our fp8 tensor-core GEMV on w, and
        that GEMV where it is the one chosen. The picker times a shape once; a shape it has timed builds the GEMV
        (a repacked copy of the weight) only where it chose it. (None, None) without a picker."""
        if picker is None:
            return None, None
        known = picker.chosen.get(key)
        mma = self._fp8_mma(w, m, k, device, picker) if known in (None, FP8_MMA) else None
        if known is not None:
            return known, mma
        x = _torch().randn(m, k, device=device).to(self.act_dtype)
        calls = {**calls, **({FP8_MMA: mma} if mma is not None else {})}
        return picker.pick(key, {name: (lambda fn=fn: fn(x)) for name, fn in calls.items()}), mma

    def _pick_bf16_gemv(self, n: int, k: int, device: str, picker: KernelPicker) -> None:
        """One row a step: our bf16 GEMV, cuBLAS through F.linear, or cuBLAS with the operands swapped (W @ x^T,
        which the gemm stage finds fastest on the narrowest shapes), whichever is fastest for this shape."""
        from ..kernels import lowprec as lp

        torch = _torch()
        x = torch.randn(1, k, device=device).to(self.act_dtype)
        candidates = {"torch linear (cuBLAS)": lambda: torch.nn.functional.linear(x, self.w),
                      "torch.mm(W, x^T) (cuBLAS)": lambda: torch.mm(self.w, x.t()).t()}
        gemvs = {}
        # the default form, and on narrow shapes (a router, the indexer's head weights) a shorter K block, so that
        # the K split spreads the few rows over more programs than 3 a tile (bf16 256x6144: 96 programs)
        narrow = lp.GemvConfig(*NARROW_GEMV)
        forms = [("lowprec.DenseGemv", None)] + ([(f"lowprec.DenseGemv ({narrow.name})", narrow)]
                                                  if n <= NARROW_ROWS else [])
        for name, cfg in forms:
            try:
                gemvs[name] = lp.DenseGemv(self.w, 1, device, cfg=cfg, out_dtype=self.act_dtype)
            except DecodeGapError:  # a shape the GEMV does not take
                pass
        candidates = {**{name: (lambda g=g: g(x)) for name, g in gemvs.items()}, **candidates}
        chosen = picker.pick(("bf16", n, k, 1), candidates)
        if chosen in gemvs:
            self.kind, self.gemm = "bf16-gemv", gemvs[chosen]
        elif chosen.startswith("torch.mm"):
            self.kind = "bf16-swapped"

    def __call__(self, x):
        torch = _torch()
        if self.kind in ("nvfp4-wo", "fp8-block", "fp8-gemv", "fp8-block-mm", "bf16-gemv", "fp8-mma"):
            return self.gemm(x)
        if self.kind == "fp8":
            return self._scaled_mm(x)
        if self.kind == "bf16-swapped":  # one row: [n, 1] transposed is the same memory as [1, n]
            return torch.mm(self.w, x.t()).t()
        return torch.nn.functional.linear(x, self.w)

    def _scaled_mm(self, x):
        """fp8 x fp8 -> act dtype through cuBLASLt (x cast with a unit scale: the bytes and the kernel, not the
        values, matter here; the weight's per-tensor scale), M padded where the build wants it."""
        torch = _torch()
        M = x.shape[0]
        if self.pad_m and M % self.pad_m:
            x = torch.nn.functional.pad(x, (0, 0, 0, self.pad_m - M % self.pad_m))
        y = torch._scaled_mm(x.to(torch.float8_e4m3fn), self.w.t(), scale_a=self.one, scale_b=self.w_scale,
                             out_dtype=self.act_dtype)
        return y[:M] if y.shape[0] != M else y


class Experts:
    """The routed experts of one MoE layer: all of them are allocated, the top-k chosen by the router run."""

    def __init__(self, E: int, inter: int, hidden: int, kind: str, act: str, device: str, backend: str,
                 top_k: int = 1) -> None:
        torch = _torch()
        self.backend, self.kind, self.E = backend, kind, E
        self.act_dtype = _tdtype(act)
        if kind in ("nvfp4", "nvfp4-moe"):  # weights quantised an expert at a time, repacked once
            from ..kernels import lowprec as lp
            from ..kernels import nvfp4 as nv

            w13 = [nv.quantize_nvfp4(torch.randn(2 * inter, hidden, device=device) * 0.02) for _ in range(E)]
            w2 = [nv.quantize_nvfp4(torch.randn(hidden, inter, device=device) * 0.02) for _ in range(E)]
            self.per_expert_bytes = nv.nvfp4_bytes(2 * inter, hidden) + nv.nvfp4_bytes(hidden, inter)
            self.nbytes = self.per_expert_bytes * E
            if kind == "nvfp4-moe":  # the fused MoE (probe_formats), built at the first call for its batch
                from ..kernels.fp4moe import Nvfp4FusedMoe, gate_up_stack

                self.build_fused = partial(Nvfp4FusedMoe, gate_up_stack(lp._stack_mma(w13, bx=True)),
                                           lp._stack_mma(w2, bx=True), top_k=top_k, out_dtype=self.act_dtype)
                self.fused = None
                return
            # the grouped NVFP4 GEMV, one call a token
            # ids and routing weights are buffers the step copies each token's choice into (graph-safe)
            self.grouped = lp.GroupedExperts("nvfp4", w13, w2, torch.zeros(top_k, dtype=torch.int32, device=device),
                                             torch.ones(top_k, device=device), device)
            return
        if kind in ("fp8-block", "fp8-gemv"):  # batch 1 (probe_formats): the grouped fp8 GEMV
            from ..kernels import fp8mma
            from ..kernels import lowprec as lp

            block = kind == "fp8-block"
            ids, rw = torch.zeros(top_k, dtype=torch.int32, device=device), torch.ones(top_k, device=device)
            w13, w2 = _fp8_weight((E, 2 * inter, hidden), device, block), _fp8_weight((E, hidden, inter), device, block)
            # on tensor cores where it runs (sm89+, H and I whole 128-value blocks): at M=1 on the H200 it read the
            # selected experts at 0.95-0.96 of a plain read, the CUDA-core form at 0.36-0.84 (fp8mma.grouped_warps)
            if fp8mma.grouped_available(device, hidden, inter):  # it keeps only its repacked copy of w13, w2
                self.grouped = fp8mma.GroupedFp8Mma(w13, w2, ids, rw, device)
            else:
                self.grouped = lp.GroupedExperts("fp8", w13, w2, ids, rw, device)
            self.per_expert_bytes = lp.fp8_bytes(2 * inter, hidden, block) + lp.fp8_bytes(hidden, inter, block)
            self.nbytes = self.per_expert_bytes * E
            return
        if kind in ("fp8-block-moe", "fp8-moe"):  # above batch 1 (probe_formats): the fused MoE, built at first call
            from ..kernels.fusedmoe import FusedMoe

            block = kind == "fp8-block-moe"
            w13 = _fp8_weight((E, 2 * inter, hidden), device, block)
            w2 = _fp8_weight((E, hidden, inter), device, block)
            self.nbytes = w13.nbytes + w2.nbytes
            self.per_expert_bytes = self.nbytes / E
            self.build_fused = partial(FusedMoe, w13, w2, top_k=top_k, out_dtype=self.act_dtype)
            self.fused = None
            return
        self.gu = _rand((E, 2 * inter, hidden), kind, device)
        self.down = _rand((E, hidden, inter), kind, device)
        self.nbytes = (self.gu.numel() + self.down.numel()) * self.gu.element_size()
        self.per_expert_bytes = self.nbytes / E
        if kind == "fp8":
            self.scale_gu = torch.full((E, 2 * inter), FP8_SCALE, device=device)
            self.scale_down = torch.full((E, hidden), FP8_SCALE, device=device)

    def __call__(self, x, ids, weights, act_fn):
        """x [M, h], ids/weights [M, k] -> [M, h]."""
        torch = _torch()
        M, k = ids.shape
        # our grouped GEMVs (NVFP4, fp8): one call a token, its k experts' ids and weights copied in (graph-safe); the
        # kernel fuses SiLU-and-mul whatever act_fn is (every MoE card here is SiLU; another GLU reads the same bytes)
        if self.kind in GROUPED_GEMV_KINDS:
            g = self.grouped
            rows = []
            for m in range(M):
                g.ids.copy_(ids[m])
                g.rw.copy_(weights[m])
                y = g(x[m:m + 1]).to(self.act_dtype)
                rows.append(y if M == 1 else y.clone())  # the next call rewrites g's output buffer
            return rows[0] if M == 1 else torch.cat(rows)
        if self.kind in FUSED_K_MULTIPLE:  # fp8 or NVFP4 weight-only; SiLU-and-mul fused (every MoE card here is SiLU)
            if self.fused is None or self.fused.m != M:  # buffers for this batch size, the weights shared
                self.fused = self.build_fused(M, device=x.device)
            return self.fused(x, ids, weights)
        if self.backend == "loop":  # CPU: the experts hit, one after another (indices read on the host)
            out = torch.zeros_like(x)
            for m, row in enumerate(ids.tolist()):
                for j, e in enumerate(row):
                    h = torch.nn.functional.linear(x[m:m + 1], self.gu[e])
                    h = act_fn(h)
                    out[m:m + 1] += weights[m, j] * torch.nn.functional.linear(h, self.down[e])
            return out
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        tok = torch.arange(M, device=x.device).repeat_interleave(k)[order]
        xs = x.index_select(0, tok)
        wts = weights.reshape(-1)[order].unsqueeze(1).to(x.dtype)
        if self.backend in ("grouped_mm", "scaled_grouped_mm"):
            counts = torch.zeros(self.E, dtype=torch.int32, device=x.device)
            counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            if self.backend == "scaled_grouped_mm":
                f8 = torch.float8_e4m3fn
                ones = torch.ones(xs.shape[0], device=x.device)
                h = torch._scaled_grouped_mm(xs.to(f8), self.gu.transpose(-2, -1), ones, self.scale_gu, offs=offs,
                                             out_dtype=self.act_dtype)
                h = act_fn(h)
                y = torch._scaled_grouped_mm(h.to(f8), self.down.transpose(-2, -1), ones, self.scale_down,
                                             offs=offs, out_dtype=self.act_dtype)
            else:
                h = act_fn(torch._grouped_mm(xs, self.gu.transpose(-2, -1), offs=offs))
                y = torch._grouped_mm(h, self.down.transpose(-2, -1), offs=offs)
        else:  # gather: copy the selected experts' weights, then a batched GEMV (reads them three times)
            sel = flat[order]
            gu = self.gu.index_select(0, sel).to(self.act_dtype)
            dn = self.down.index_select(0, sel).to(self.act_dtype)
            h = act_fn(torch.bmm(gu, xs.unsqueeze(2)).squeeze(2))
            y = torch.bmm(dn, h.unsqueeze(2)).squeeze(2)
        out = torch.zeros_like(x)
        out.index_add_(0, tok, y * wts)
        return out
