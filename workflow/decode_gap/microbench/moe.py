"""MoE decode at the model's expert shapes: routing pieces, then expert GEMMs as a per-expert loop against a
grouped kernel.

Routing for M tokens (bf16 activations): the router GEMM, scoring (sigmoid or softmax, DeepSeek's
group-limited top-k when the card has n_group > 1), top-k, permute (sort the M*k token-expert pairs by
expert and gather rows) and unpermute (weight and scatter-add rows back to tokens).

Expert GEMMs for the permuted rows: gate_up [2I, H], SiLU-and-mul, down [H, I] for every expert hit.
- `loop`: one torch.mm per expert per projection (what a naive implementation launches);
- `grouped_mm`: `torch._grouped_mm` (bf16, one launch per projection);
- `scaled_grouped_mm`: `torch._scaled_grouped_mm` (fp8 e4m3 with row-wise scales, sm90+);
- `fused_moe` (GPU with Triton, sm89+): the fused MoE over the token-expert pairs sorted by expert, each expert hit
  read once: fp8 above batch 1 (`kernels.fusedmoe`, as engines' Triton fused_moe_kernel) with one scale an expert
  (`fp8`) and with 128x128 block scales (`fp8-block`), and NVFP4 weight-only at every batch (`kernels.fp4moe`):
  what the kernel level runs for those routed experts;
- `grouped_gemv` (M=1, GPU with Triton): our grouped GEMV over only the selected experts (lowprec.py) in bf16,
  fp8 (per-tensor and 128x128 block scales) and nvfp4: gate+up with the SiLU fused, then down with the routing
  weights and the sum fused. Its bytes are the selected experts' weights in their stored format. Where lowprec has
  other forms of the same weights (`grouped_alternatives`), and for fp8 the tensor-core form (fp8mma.GroupedFp8Mma,
  at 4 and 8 warps a program), each is timed and the fastest kept, the others' times in the row's note, as the gemm
  stage keeps the fastest GEMV form of a shape.
Routing is also timed as one row, `moe.routing` (router GEMM, scoring, top-k, permute and unpermute together).
On a GPU `moe.route_fused` is `moe.route` with the scoring and top-k as one Triton kernel (`kernels.routing`, what
the kernel level runs), against the dozen small torch kernels of `moe.route`.
Only the experts the routing hits are allocated (a compact id per hit expert), which changes no kernel's
work: an expert with no rows costs nothing in either form.
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import torch
import torch.nn.functional as F

from ..kernels import fp4moe, fp8mma, fusedmoe
from ..kernels import lowprec as lp
from ..kernels import nvfp4 as nv
from ..kernels import routing as rt
from ..errors import REASON_CHARS, describe
from .common import BenchEnv, skip, summary
from .shapes import MoeShape
from .timing import ClockWatch, CpuCacheFlusher, L2Flusher, fraction, gbps, measure, tflops

COLUMNS = [
    "name", "impl", "dtype", "backend", "M", "top_k", "experts_hit", "rows", "H", "I", "gpu_us", "eager_us",
    "gbps", "tflops", "frac_of_copy_bw", "gpu_min_us", "gpu_p99_us", "eager_min_us", "eager_p99_us",
    "eager_loop_us", "timing", "iters", "bytes", "flops", "kernels", "note", "plain_read_us", "frac_of_plain_read",
    "clock_capped_frac", "clock_capped_by", "sm_clock_mhz", "latency_floor_us",
]
FLOOR_METHOD = ("an expert row's kernels x the one-row GEMV floor (microbench.launch.latency_floor, measured a "
                "kernel): modelled, the least a chain of that many dependent kernels takes")


def routing_of(shape: MoeShape) -> rt.Routing:
    return rt.Routing(shape.experts_total, shape.top_k, shape.scoring == "sigmoid", shape.n_group, shape.topk_group,
                      shape.norm_topk_prob, shape.routed_scaling_factor)


def route(x: torch.Tensor, w_router: torch.Tensor, shape: MoeShape, bias: torch.Tensor | None = None):
    """Router GEMM + scoring + top-k in torch ops. Returns (topk weights [M, k] fp32, topk ids [M, k] int64)."""
    return rt.route_reference(x @ w_router.t(), routing_of(shape), bias)


def permute(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: int):
    """Sort token-expert pairs by expert: rows [M*k, H], token of each row, weight of each row, offsets."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    rows = x.index_select(0, token)
    # scatter_add rather than bincount: bincount syncs with the host, which a CUDA graph cannot capture
    counts = torch.zeros(experts, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return rows, token, weights.reshape(-1).index_select(0, order), offs


def unpermute(y_rows: torch.Tensor, token: torch.Tensor, row_weights: torch.Tensor, m: int) -> torch.Tensor:
    out = torch.zeros((m, y_rows.shape[1]), dtype=torch.float32, device=y_rows.device)
    out.index_add_(0, token, y_rows.float() * row_weights[:, None])
    return out.to(y_rows.dtype)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


class TooLarge(Exception):
    pass


class ExpertSet:
    """Weights of the experts a routing hits, and the rows routed to each (compact expert ids)."""

    def __init__(self, env: BenchEnv, shape: MoeShape, m: int, seed: int = 0, dtype=torch.bfloat16,
                 max_weight_elements: int | None = None):
        dev = env.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.x = torch.randn((m, shape.hidden), generator=gen, device=dev, dtype=dtype)
        w_router = torch.randn((shape.experts_total, shape.hidden), generator=gen, device=dev, dtype=dtype) * 0.02
        weights, ids = route(self.x, w_router, shape)
        local = ids < shape.experts_local  # with EP, this rank serves the experts in its range
        hit = torch.unique(ids[local])
        self.experts_hit = int(hit.numel())
        compact = torch.full((shape.experts_total,), -1, dtype=torch.long, device=dev)
        compact[hit] = torch.arange(self.experts_hit, device=dev)
        # rows for local experts only: drop the others by routing them past the last compact id
        cids = torch.where(local, compact[ids], torch.full_like(ids, self.experts_hit))
        self.cids, self.weights = cids, weights  # [m, top_k]: the fused MoE sorts them itself
        rows, token, roww, offs = permute(self.x, cids, weights, self.experts_hit + 1)
        n_local_rows = int(offs[self.experts_hit - 1].item()) if self.experts_hit else 0
        self.rows = rows[:n_local_rows].contiguous()
        self.token = token[:n_local_rows]
        self.row_weights = roww[:n_local_rows]
        self.offs = offs[: self.experts_hit].contiguous()
        self.counts = torch.diff(self.offs, prepend=torch.zeros(1, dtype=torch.int32, device=dev)).tolist()
        h, i = shape.hidden, shape.inter
        need = self.experts_hit * 3 * h * i
        if max_weight_elements is not None and need > max_weight_elements:
            raise TooLarge(f"{self.experts_hit} experts = {need} weight elements exceed "
                           f"microbench.cpu_max_weight_elements={max_weight_elements} on a CPU host")
        self.w13 = torch.randn((self.experts_hit, 2 * i, h), generator=gen, device=dev, dtype=dtype) * 0.02  # [E, 2I, H]
        self.w2 = torch.randn((self.experts_hit, h, i), generator=gen, device=dev, dtype=dtype) * 0.02  # [E, H, I]
        self.m = m

    @property
    def weight_elements(self) -> int:
        return self.w13.numel() + self.w2.numel()


def loop_fn(es: ExpertSet) -> Callable[[], torch.Tensor]:
    bounds, start = [], 0
    for c in es.counts:
        bounds.append((start, start + int(c)))
        start += int(c)
    out = torch.empty((es.rows.shape[0], es.w2.shape[1]), dtype=es.rows.dtype, device=es.rows.device)

    def run() -> torch.Tensor:
        for e, (a, b) in enumerate(bounds):
            h = es.rows[a:b] @ es.w13[e].t()
            torch.mm(silu_mul(h), es.w2[e].t(), out=out[a:b])
        return out

    return run


def grouped_fn(es: ExpertSet) -> Callable[[], torch.Tensor]:
    w13t = es.w13.transpose(1, 2)  # [E, H, 2I]
    w2t = es.w2.transpose(1, 2)  # [E, I, H]

    def run() -> torch.Tensor:
        h = torch._grouped_mm(es.rows, w13t, offs=es.offs)
        return torch._grouped_mm(silu_mul(h), w2t, offs=es.offs)

    return run


def scaled_grouped_fn(es: ExpertSet) -> Callable[[], torch.Tensor]:
    """fp8 e4m3 with row-wise scales (per row of the activation, per output channel of each expert)."""
    w13_8, s13 = nv.quantize_e4m3_groups(es.w13)  # [E, 2I, H], [E, 2I]: a scale a row
    w2_8, s2 = nv.quantize_e4m3_groups(es.w2)  # [E, H, I], [E, H]
    w13t, w2t = w13_8.transpose(1, 2), w2_8.transpose(1, 2)  # column-major [E, H, 2I], [E, I, H]
    x8, sx = nv.quantize_e4m3_groups(es.rows)

    def run() -> torch.Tensor:
        h = torch._scaled_grouped_mm(x8, w13t, sx, s13, offs=es.offs, out_dtype=torch.bfloat16)
        a8, sa = nv.quantize_e4m3_groups(silu_mul(h))
        return torch._scaled_grouped_mm(a8, w2t, sa, s2, offs=es.offs, out_dtype=torch.bfloat16)

    return run


GEMV_FORMATS = ("bf16", "fp8", "fp8-block", "nvfp4")  # fp8: per-tensor scales, as the kernel level runs fp8


def grouped_gemv(es: ExpertSet, fmt: str) -> "lp.GroupedExperts":
    """Our grouped GEMV over the experts this token selected (M=1: one row per expert, in expert order)."""
    if es.m != 1:
        raise ValueError("the grouped GEMV is the M=1 path")
    ids = torch.arange(es.experts_hit, dtype=torch.int32, device=es.x.device)
    return lp.grouped_from_bf16(fmt, es.w13, es.w2, ids, es.row_weights, es.x.device)


FUSED_FORMATS = ("fp8", "fp8-block", "nvfp4")


def fused_moe(es: ExpertSet, fmt: str) -> "fusedmoe.FusedMoe | fp4moe.Nvfp4FusedMoe":
    """The fused MoE over this routing's pairs (compact expert ids; another EP rank's pairs are dropped): fp8 (one
    scale an expert, or 128x128 blocks) or NVFP4 weight-only (quantised an expert at a time)."""
    if fmt == "nvfp4":
        # planned for the experts hit: its table holds only those (uniform choices over it would plan for fewer)
        return fp4moe.Nvfp4FusedMoe([nv.quantize_nvfp4(w) for w in es.w13], [nv.quantize_nvfp4(w) for w in es.w2],
                                    es.m, es.cids.shape[1], es.x.device, experts_hit=es.experts_hit)
    block = fmt == "fp8-block"
    return fusedmoe.FusedMoe(fusedmoe.quantize_experts(es.w13, block), fusedmoe.quantize_experts(es.w2, block), es.m,
                             es.cids.shape[1], es.x.device)


def fastest_form(g: "lp.GroupedExperts", time_form: Callable[[list], dict[str, Any] | None],
                 skipped: list[dict[str, str]]) -> dict[str, Any] | None:
    """g timed in each of its forms (lp.grouped_alternatives, the default first) by time_form(failures), which
    returns a row or None and appends why to failures; the fastest row with its kernel count and the others' times
    in its note (_fastest_of, a tie kept by the earlier form), or None if no form ran; g is left in that form. A
    form that fails is named as itself in `skipped`, beside the row another form still gives."""
    best, best_forms = None, (g.cfg13, g.cfg2)
    for forms in lp.grouped_alternatives(g):
        g.cfg13, g.cfg2 = forms
        failed: list[dict[str, str]] = []
        row = time_form(failed)
        skipped.extend({**f, "case": f"{f['case']} ({g.label})"} for f in failed)
        if row:
            row = {**row, "kernels": g.kernels}
            if best is None or row["gpu_us"] < best["gpu_us"]:
                best_forms = forms
            best = _fastest_of(best, row)
    g.cfg13, g.cfg2 = best_forms
    return best


def grouped_fp8_mma(es: ExpertSet, fmt: str) -> "fp8mma.GroupedFp8Mma":
    """The selected experts on our fp8 tensor-core GEMV (kernels/fp8mma), per-expert or 128x128 block scales."""
    ids = torch.arange(es.experts_hit, dtype=torch.int32, device=es.x.device)
    block = fmt == "fp8-block"
    return fp8mma.GroupedFp8Mma(lp.quantize_fp8(es.w13, block), lp.quantize_fp8(es.w2, block), ids, es.row_weights,
                                es.x.device)


def grouped_fp8_mma_row(env: BenchEnv, es: ExpertSet, fmt: str, time_it: Callable[[Any], dict[str, Any] | None],
                        skipped: list[dict[str, str]]) -> dict[str, Any] | None:
    """The tensor-core form's row (time_it(its call object)), or None where it does not run here (named in
    `skipped`): sm89+ and H, I whole 128-value blocks."""
    h, i = es.w13.shape[2], es.w2.shape[2]
    if not fp8mma.grouped_available(env.device, h, i):
        skipped.append(skip(f"grouped_gemv {fmt} tensor-core M=1", f"needs Triton, sm89+ and H, I multiples of "
                                                                   f"{fp8mma.ITER_K} (H={h}, I={i}; {env.sm})"))
        return None
    try:
        tc = grouped_fp8_mma(es, fmt)
        tc(es.x)  # fail here (compile error) rather than inside the timing
    except Exception as exc:
        skipped.append(skip(f"grouped_gemv {fmt} tensor-core M=1", describe(exc, REASON_CHARS)))
        return None
    best = None
    for warps in sorted((4, 8), key=lambda w: w != tc.warps):  # its default first (fp8mma.grouped_warps)
        tc.set_warps(warps)
        row = time_it(tc)
        best = _fastest_of(best, {**row, "kernels": tc.kernels} if row else None)
    return best


FASTEST_OF = "fastest of: "


def _fastest_of(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The faster of two rows of one case, its note naming the other's time (as the gemm stage's rows do)."""
    if a is None or b is None:
        return a or b
    win, lose = (a, b) if a["gpu_us"] <= b["gpu_us"] else (b, a)
    lost = [f"{lose['backend']} {lose['gpu_us']:.2f} us"]
    notes = []
    for own, note in ((True, win.get("note")), (False, lose.get("note"))):  # the loser's losers listed once
        for part in str(note or "").split("; "):
            if part.startswith(FASTEST_OF):
                lost.append(part[len(FASTEST_OF):])
            elif part and own:  # the winner's own timing note; the loser's is dropped with it
                notes.append(part)
    return {**win, "note": "; ".join(notes + [FASTEST_OF + ", ".join(lost)])}


def _expert_bytes(es: ExpertSet, weight_bytes_per_elem: float, act_bytes: int) -> int:
    rows, h = es.rows.shape
    i = es.w2.shape[2]
    act = rows * h * act_bytes + rows * 2 * i * 2 + rows * i * act_bytes + rows * h * 2
    return int(es.weight_elements * weight_bytes_per_elem + act)


def _expert_flops(es: ExpertSet) -> int:
    rows, h = es.rows.shape
    i = es.w2.shape[2]
    return 2 * rows * h * 2 * i + 2 * rows * i * h


def run_moe_bench(env: BenchEnv, shape: MoeShape | None, m_values: list[int], log=print) -> tuple[pd.DataFrame, dict[str, Any]]:
    skipped: list[dict[str, str]] = []
    if shape is None:
        df = pd.DataFrame([], columns=COLUMNS)
        out = summary("microbench.moe", env, env.backend, [skip("moe", "the model has no MoE layers")], 0)
        return df, out
    rows: list[dict[str, Any]] = []
    flush = L2Flusher(env.device) if env.is_gpu else CpuCacheFlusher()
    impls = ["loop", "grouped_mm"]
    if env.is_gpu and (env.capability or (0, 0)) >= (9, 0) and hasattr(torch, "_scaled_grouped_mm"):
        impls.append("scaled_grouped_mm")
    else:
        skipped.append(skip("scaled_grouped_mm", f"fp8 grouped GEMM needs sm90+ (torch._scaled_grouped_mm); this device is {env.sm}"))
    for m in m_values:
        try:
            es = ExpertSet(env, shape, m, max_weight_elements=None if env.is_gpu else env.cpu_max_weight_elements)
        except TooLarge as exc:
            skipped.append(skip(f"experts M={m}", str(exc)))
            continue
        except Exception as exc:
            skipped.append(skip(f"experts M={m}", describe(exc, REASON_CHARS)))
            continue
        base = {"M": m, "top_k": shape.top_k, "experts_hit": es.experts_hit, "rows": int(es.rows.shape[0]),
                "H": shape.hidden, "I": shape.inter}
        # routing pieces
        w_router = torch.randn((shape.experts_total, shape.hidden), device=env.device, dtype=torch.bfloat16) * 0.02
        weights, ids = route(es.x, w_router, shape)
        rows_all, token, roww, _ = permute(es.x, ids, weights, shape.experts_total)
        pieces: list[tuple[str, Callable[[], Any], int, int, int]] = [
            ("moe.router_gemm", lambda: es.x @ w_router.t(), w_router.numel() * 2 + es.x.numel() * 2,
             2 * m * shape.hidden * shape.experts_total, 1),
            ("moe.route", lambda: route(es.x, w_router, shape), w_router.numel() * 2, 2 * m * shape.hidden * shape.experts_total, 0),
            ("moe.permute", lambda: permute(es.x, ids, weights, shape.experts_total), rows_all.numel() * 2 * 2, 0, 0),
            ("moe.unpermute", lambda: unpermute(rows_all, token, roww, m), rows_all.numel() * 2 + m * shape.hidden * 2, 0, 0),
        ]
        if env.is_gpu and rt.fused_fits(routing_of(shape)) is None:  # scoring and top-k as one kernel
            fused = rt.FusedRoute(routing_of(shape), m, env.device)
            pieces.append(("moe.route_fused", lambda: fused(es.x @ w_router.t()), w_router.numel() * 2,
                           2 * m * shape.hidden * shape.experts_total, 0))
        pieces.append(("moe.routing", lambda: unpermute(permute(es.x, route(es.x, w_router, shape)[1], weights,
                                                                shape.experts_total)[0], token, roww, m),
                       w_router.numel() * 2 + rows_all.numel() * 2 * 3, 2 * m * shape.hidden * shape.experts_total, 0))
        for name, fn, nb, fl, _ in pieces:
            backend = "triton fused + torch router GEMM" if name == "moe.route_fused" else "torch"
            rows.append(_time_row(env, flush, name, "routing", "bf16", backend, fn, nb, fl, base, skipped, log))
        if m == 1 and env.is_gpu and lp.HAVE_TRITON:
            for fmt in GEMV_FORMATS:
                try:
                    g = grouped_gemv(es, fmt)
                    g(es.x)  # fail here (compile error) rather than inside the timing
                except Exception as exc:
                    skipped.append(skip(f"grouped_gemv {fmt} M={m}", describe(exc, REASON_CHARS)))
                    continue
                nb = g.weight_bytes() + 2 * shape.hidden * 2 + g.slots * shape.inter * 4
                best = fastest_form(g, lambda failed, g=g: _time_row(
                    env, flush, "moe.experts", "grouped_gemv", fmt, g.label, lambda: g(es.x), nb, _expert_flops(es),
                    base, failed, log), skipped)
                if fmt.startswith("fp8"):
                    best = _fastest_of(best, grouped_fp8_mma_row(env, es, fmt, lambda tc: _time_row(
                        env, flush, "moe.experts", "grouped_gemv", fmt, tc.label, lambda: tc(es.x), nb,
                        _expert_flops(es), base, skipped, log), skipped))  # nb: the same experts' bytes
                if best:
                    rows.append(best)
                g = None
        sm89 = env.is_gpu and lp.HAVE_TRITON and (env.capability or (0, 0)) >= (8, 9)
        # fp8 above batch 1 (the GEMV is its batch-1 path); NVFP4 at every batch, as the kernel level runs it
        for fmt in [f for f in FUSED_FORMATS if m > 1 or f == "nvfp4"] if sm89 else ():
            try:
                moe = fused_moe(es, fmt)
                moe(es.x, es.cids, es.weights)  # fail here (compile error) rather than inside the timing
            except Exception as exc:
                skipped.append(skip(f"fused_moe {fmt} M={m}", describe(exc, REASON_CHARS)))
                continue
            act_bytes = 1 if fmt.startswith("fp8") else 2
            nb = _expert_bytes(es, 0, act_bytes) + moe.weight_bytes(es.experts_hit)
            row = _time_row(env, flush, "moe.experts", "fused_moe", fmt, moe.label,
                            lambda moe=moe: moe(es.x, es.cids, es.weights), nb, _expert_flops(es), base, skipped, log)
            if row:
                rows.append({**row, "kernels": moe.kernels})
            moe = None
        if not sm89:
            skipped.append(skip(f"fused_moe M={m}", f"the fused MoE (fp8 dots; NVFP4 decoded onto bf16 tensor cores) "
                                                    f"needs a CUDA GPU with Triton, sm89+; this device is {env.sm}"))
        for impl in impls:
            try:
                if impl == "loop":
                    fn, dt, be, wb, ab, kernels = loop_fn(es), "bf16", "torch.mm per expert", 2, 2, 4 * es.experts_hit
                elif impl == "grouped_mm":
                    fn, dt, be, wb, ab, kernels = grouped_fn(es), "bf16", "torch._grouped_mm", 2, 2, 4
                else:
                    # the two GEMMs, silu, mul and quantize_e4m3_groups' seven (cast, abs, amax, scale, floor,
                    # divide, to e4m3) between them
                    fn, dt, be, wb, ab, kernels = (scaled_grouped_fn(es), "fp8",
                                                   "torch._scaled_grouped_mm(e4m3, row-wise)", 1, 1, 11)
                fn()  # fail here (unsupported backend) rather than inside the timing
            except Exception as exc:
                skipped.append(skip(f"{impl} M={m}", describe(exc, REASON_CHARS)))
                continue
            row = _time_row(env, flush, "moe.experts", impl, dt, be, fn, _expert_bytes(es, wb, ab), _expert_flops(es),
                            base, skipped, log)
            if row:
                row["kernels"] = kernels
                rows.append(row)
        es = None  # free the expert weights before the next M
        if env.is_gpu:
            torch.cuda.empty_cache()
    rows = [r for r in rows if r]
    from .launch import PlainReads, latency_floor  # same stage

    reads = PlainReads(env, flush)  # the expert rows beside a plain read of their bytes, as the gemm stage's rows
    floor = latency_floor(env)
    one_kernel_us = (floor.get("one_row_gemv_us") or {}).get("value")
    for r in rows:
        if r["impl"] != "routing":
            r.update(reads.columns(r["bytes"], r["gpu_us"] if r["gpu_us"] is not None else r["eager_us"]))
            # a call of N dependent kernels cannot take less than N kernels' floor, whatever its bytes
            r["latency_floor_us"] = expert_floor_us(r.get("kernels"), one_kernel_us)
    df = pd.DataFrame(rows, columns=COLUMNS)
    out = moe_summary(env, df, shape, skipped + reads.skipped)
    out["plain_read_method"] = reads.method
    out["latency_floor"] = floor
    out["latency_floor_method"] = FLOOR_METHOD
    return df, out


def expert_floor_us(kernels: Any, one_kernel_us: float | None) -> float | None:
    """The latency floor of an expert row: its kernel launches times the one-row GEMV floor (modelled); None where
    either is unknown (a CPU host, a row without a kernel count)."""
    try:
        n = int(kernels)
    except (TypeError, ValueError):
        return None
    return n * one_kernel_us if one_kernel_us and n > 0 else None


def _time_row(env, flush, name, impl, dtype, backend, fn, nbytes, fl, base, skipped, log) -> dict[str, Any] | None:
    try:
        with ClockWatch(env.device) as watch:  # the GPU's clocks while the case is timed (as the gemm stage)
            t = measure([fn], env.device, env.warmup, env.iters, flush=flush, cpu_budget_s=env.cpu_budget_s,
                        graphs=env.graphs, min_graph_calls=2 if impl == "loop" else 8)
    except Exception as exc:
        skipped.append(skip(f"{name} {impl} M={base['M']}", describe(exc, REASON_CHARS)))
        return None
    bw = gbps(nbytes, t.device_us)
    log(f"moe {name} {impl} M={base['M']}: {t.device_us:.1f} us ({t.method}), eager {t.eager.median_us:.1f} us")
    return {"name": name, "impl": impl, "dtype": dtype, "backend": backend, **base, **t.columns(), "gbps": bw,
            "tflops": tflops(fl, t.device_us) if fl else None, "frac_of_copy_bw": fraction(bw, env.copy_gbps),
            "bytes": nbytes, "flops": fl, "kernels": None, "note": t.note, **watch.columns()}


def moe_summary(env: BenchEnv, df: pd.DataFrame, shape: MoeShape, skipped: list[dict[str, str]]) -> dict[str, Any]:
    col = "gpu_us" if env.is_gpu else "eager_us"
    per_m: dict[str, Any] = {}
    for m, g in df.groupby("M"):
        entry: dict[str, Any] = {}
        for _, r in g.iterrows():
            key = r["name"].replace("moe.", "") if r["name"] != "moe.experts" else f"experts_{r['impl']}"
            if r["impl"] in ("grouped_gemv", "fused_moe"):  # one row a weight format
                key = f"{key}_{str(r['dtype']).replace('-', '_')}"
            entry[f"{key}_us"] = r[col]
            if r["name"] == "moe.experts":
                entry[f"{key}_eager_us"] = r["eager_us"]
                if pd.notna(r.get("plain_read_us")):  # a plain read of the same (selected experts') bytes
                    entry[f"{key}_plain_read_us"] = r["plain_read_us"]
        if "experts_loop_us" in entry and "experts_grouped_mm_us" in entry and entry["experts_grouped_mm_us"]:
            entry["loop_over_grouped"] = entry["experts_loop_us"] / entry["experts_grouped_mm_us"]
        per_m[str(int(m))] = entry
    return summary(
        "microbench.moe", env, env.backend, skipped, int(len(df)),
        shape={"hidden": shape.hidden, "experts_total": shape.experts_total, "experts_local": shape.experts_local,
               "top_k": shape.top_k, "inter": shape.inter, "scoring": shape.scoring, "n_group": shape.n_group,
               "topk_group": shape.topk_group, "moe_layers": shape.moe_layers},
        by_m=per_m,
        timing="gpu_us: CUDA-graph replay (GPU time); eager_us: one isolated call" if env.is_gpu else "perf_counter wall time",
    )
