"""Kernel level: one decode step of the configured model as one GPU sees it after TP sharding.

Real tensors of the per-GPU shapes (random weights: timing does not depend on their values) run through the
kernels a decode step launches: the embedding row; per layer the norms, the attention projections (or MLA in its
absorbed decode form, with the DSA indexer where the card has one), attention over the KV length, the
all-reduces, the router and the shared plus top-k routed experts (or the dense MLP); the final norm, the lm_head
and sampling. The step runs eagerly and as one captured CUDA graph; eager minus graph is the launch overhead.

Layers: `simulate.layers` of them ("auto": what fits in GPU memory, a few on a CPU), keeping the model's mix of
layer kinds (dense/MoE MLP, full/sliding attention). Each kind is timed as its own segment and scaled by
(layers of that kind) / (simulated layers of that kind); the head (embedding, final norm, lm_head, sampling) is
timed once. The result records the layers simulated and the scale.

All-reduce: with a world size above 1 (tp GPUs present, or gloo ranks on a CPU) the real collective runs inside
the step (torch.distributed). With one rank and tp > 1 the measured all-reduce time at the model's message size
(microbench/allreduce.json) times the collectives per token is added as a `modelled` component.

Weight formats: bf16 runs as bf16; fp8 and fp8-block run `torch._scaled_mm` / `torch._scaled_grouped_mm` where
the device has them (per-tensor scales; block scales are not simulated, their bytes are negligible). A format the
kernel level cannot run here (GGUF quants, NVFP4 without a kernel, fp8 on a CPU) runs a stand-in dtype and says so
(`format_match: false`); the gap attribution then keeps the kernel level off its chain.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DecodeGapError
from ..model import ModelSpec
from .shapes import StepShapes, kv_row_elems, layer_bytes, plan_layers, step_shapes
from ..timing import capture_graph
from .timing import L2Flusher, spread, time_cpu, time_cuda

HEAD_COMPONENTS = ("embedding", "final norm", "lm_head", "sampling")
COMPONENT_ORDER = (
    "embedding", "norms", "attention projections", "attention", "all-reduce", "mlp", "router",
    "shared expert", "routed experts", "final norm", "lm_head", "sampling",
)


@dataclass
class KernelSettings:
    tp: int = 1
    ep: int = 1
    batch: int = 1
    context_len: int = 512
    weight_format: str = "bf16"
    kv_cache_dtype: str = "auto"
    layers: int | str = "auto"
    sampling: str = "greedy"
    warmup: int = 3
    iters: int = 20
    device: str = "auto"  # auto | cpu | cuda
    memory_fraction: float = 0.8  # of free GPU memory the weights may take
    cpu_auto_layers: int = 4
    allreduce_us: float | None = None  # measured all-reduce at the model's message size (one rank, tp > 1)
    allreduce_source: str = ""
    allreduce_why: str = ""
    ranks: int | None = None  # None: tp ranks when the host has them (tp GPUs, or gloo on a CPU), else 1
    timeout_s: float = 3600.0  # every rank is stopped past it (a hung collective never blocks the DAG)


# ----------------------------------------------------------------------------------------------------------
# capability probes


def _torch():
    import torch

    return torch


def probe_formats(weight_format: str, device: str) -> dict[str, Any]:
    """Decide the dtypes the kernel level runs for `weight_format` on `device`, by trying them."""
    torch = _torch()
    on_gpu = device.startswith("cuda")
    act = "bf16" if on_gpu else ("bf16" if weight_format == "bf16" else "fp32")
    info: dict[str, Any] = {"activations": act, "linear": act, "format_match": True, "stand_in": ""}
    if weight_format == "bf16":
        return info
    if weight_format in ("fp8", "fp8-block") and on_gpu:
        try:
            w = torch.randn(32, 64, device=device).to(torch.float8_e4m3fn)
            one = torch.ones((), device=device)
            try:
                x = torch.randn(1, 64, device=device).to(torch.float8_e4m3fn)
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            except Exception:  # some builds want M padded to 16 rows, as engines do for decode
                x = torch.randn(16, 64, device=device).to(torch.float8_e4m3fn)
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                info["pad_m"] = 16
            info["linear"] = "fp8"
            if weight_format == "fp8-block":
                info["note"] = "fp8-block runs with per-tensor scales (block scales are not simulated)"
            return info
        except Exception as exc:  # no fp8 tensor cores (sm < 89) or no kernel
            why = f"torch._scaled_mm fp8 failed here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    elif weight_format == "nvfp4" and on_gpu:
        try:
            from ..microbench import nvfp4 as nv

            q = nv.quantize_nvfp4(torch.randn(64, 64, device=device))
            nv.WeightOnlyGemm(q, 1, device)(torch.randn(1, 64, device=device, dtype=torch.bfloat16))
            info["linear"] = "nvfp4-wo"
            info["experts"] = "bf16"
            info["note"] = ("nvfp4 linears run the micro-benchmarks' nvfp4-weight-only Triton kernel "
                            "(decode_gap.microbench.nvfp4); routed experts run bf16")
            info["experts_stand_in"] = True
            return info
        except Exception as exc:
            why = f"nvfp4-weight-only kernel failed here ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
    elif on_gpu:
        why = f"no kernel for {weight_format} weights at the kernel level on this GPU"
    else:
        why = f"{weight_format} weights have no torch CPU kernel here"
    info.update(format_match=False, stand_in=f"{why}: {act} stand-in weights (bytes and kernels differ from {weight_format})")
    return info


def _probe_grouped(device: str, linear: str) -> str:
    """MoE expert kernel: grouped GEMM (reads only the experts hit) where it runs, else gather + bmm."""
    torch = _torch()
    if not device.startswith("cuda"):
        return "loop"
    try:
        E, K, N = 4, 64, 32
        offs = torch.tensor([1, 1, 2, 2], dtype=torch.int32, device=device)
        if linear == "fp8":
            x = torch.randn(2, K, device=device).to(torch.float8_e4m3fn)
            w = torch.randn(E, N, K, device=device).to(torch.float8_e4m3fn)
            torch._scaled_grouped_mm(x, w.transpose(-2, -1), torch.ones(2, device=device),
                                     torch.ones(E, N, device=device), offs=offs, out_dtype=torch.bfloat16)
            return "scaled_grouped_mm"
        x = torch.randn(2, K, device=device, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device=device, dtype=torch.bfloat16)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        return "grouped_mm"
    except Exception:
        return "gather"


# ----------------------------------------------------------------------------------------------------------
# tensors


def _tdtype(name: str):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[name]


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


class Linear:
    """y = x @ W^T for one weight matrix in the kernel level's dtype for it."""

    def __init__(self, n: int, k: int, kind: str, act: str, device: str, m: int = 1, pad_m: int = 0) -> None:
        torch = _torch()
        self.kind = kind
        self.pad_m = pad_m
        self.act_dtype = _tdtype(act)
        if kind == "nvfp4-wo":
            from ..microbench import nvfp4 as nv

            q = nv.quantize_nvfp4(torch.randn(n, k, device=device) * 0.02)
            self.gemm = nv.WeightOnlyGemm(q, m, device, out_dtype=self.act_dtype)
            self.nbytes = nv.nvfp4_bytes(n, k)
            return
        self.w = _rand((n, k), kind, device)
        self.nbytes = self.w.numel() * self.w.element_size()
        if kind == "fp8":
            self.one = torch.ones((), device=device)

    def __call__(self, x):
        torch = _torch()
        if self.kind == "nvfp4-wo":
            return self.gemm(x)
        if self.kind == "fp8":
            M = x.shape[0]
            if self.pad_m and M % self.pad_m:
                x = torch.nn.functional.pad(x, (0, 0, 0, self.pad_m - M % self.pad_m))
            y = torch._scaled_mm(x.to(torch.float8_e4m3fn), self.w.t(), scale_a=self.one, scale_b=self.one,
                                 out_dtype=self.act_dtype)
            return y[:M] if y.shape[0] != M else y
        return torch.nn.functional.linear(x, self.w)


class Experts:
    """The routed experts of one MoE layer: all of them are allocated, the top-k chosen by the router run."""

    def __init__(self, E: int, inter: int, hidden: int, kind: str, act: str, device: str, backend: str) -> None:
        torch = _torch()
        self.backend, self.kind, self.E = backend, kind, E
        self.gu = _rand((E, 2 * inter, hidden), kind, device)
        self.down = _rand((E, hidden, inter), kind, device)
        self.nbytes = (self.gu.numel() + self.down.numel()) * self.gu.element_size()
        self.per_expert_bytes = self.nbytes / E
        self.act_dtype = _tdtype(act)
        if kind == "fp8":
            self.scale_gu = torch.ones(E, 2 * inter, device=device)
            self.scale_down = torch.ones(E, hidden, device=device)

    def __call__(self, x, ids, weights, act_fn):
        """x [M, h], ids/weights [M, k] -> [M, h]."""
        torch = _torch()
        M, k = ids.shape
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


# ----------------------------------------------------------------------------------------------------------
# the step


@dataclass
class Op:
    component: str
    segment: str  # "head" or a layer kind
    fn: Callable[[dict], None]


def _act_fn(spec: ModelSpec):
    torch = _torch()
    F = torch.nn.functional
    act = (spec.raw or {}).get("hidden_activation") or (spec.raw or {}).get("hidden_act") or "silu"

    def glu(h):
        g, u = h.chunk(2, dim=-1)
        return (F.gelu(g, approximate="tanh") if "gelu" in act else F.silu(g)) * u

    return glu


def _rope(x, cos, sin):
    torch = _torch()
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class DecodeStep:
    """Builds the tensors and the op list of one decode step for the simulated layers."""

    def __init__(self, shapes: StepShapes, plan: dict[str, int], fmt: dict[str, Any], device: str,
                 kv_len: int, sampling: str, group=None) -> None:
        torch = _torch()
        self.torch, self.shapes, self.plan, self.device, self.group = torch, shapes, plan, device, group
        spec = shapes.spec
        self.spec = spec
        self.act = fmt["activations"]
        self.lin_kind = fmt["linear"]
        self.experts_kind = fmt.get("experts", fmt["linear"])
        self.pad_m = int(fmt.get("pad_m", 0))
        self.moe_backend = _probe_grouped(device, self.experts_kind) if spec.is_moe else ""
        M, h = shapes.batch, spec.hidden
        self.kv_len = kv_len
        self.T = kv_len + 1  # the new token attends to the cache and itself
        dt = _tdtype(self.act)
        self.weight_bytes = 0.0
        self.kv_bytes = 0.0
        eps = float((spec.raw or {}).get("rms_norm_eps", 1e-6) or 1e-6)
        self.eps = eps
        # state shared by the ops (values do not matter, shapes do)
        S: dict[str, Any] = {"tok": torch.zeros(M, dtype=torch.long, device=device)}
        self.S = S
        self.ops: list[Op] = []
        # embedding (vocab-parallel under TP) and the lm_head (the same matrix when tied)
        emb = _rand((shapes.vocab, h), self.act, device)
        self.weight_bytes += h * emb.element_size() * M  # one row per token is read
        lm = emb if spec.tie_embeddings else _rand((shapes.vocab, h), self.act, device)
        self.weight_bytes += lm.numel() * lm.element_size()
        scale = math.sqrt(h) if spec.family == "gemma3" else 1.0
        F = torch.nn.functional

        vocab_local = shapes.vocab

        def embed(S):  # vocab-parallel under TP: a token outside this rank's rows reads a row too (then all-reduce)
            x = emb.index_select(0, S["tok"] % vocab_local)
            S["x"] = x * scale if scale != 1.0 else x

        self.ops.append(Op("embedding", "head", embed))
        if group is not None:
            self.ops.append(Op("all-reduce", "head", self._allreduce("x")))
        # rope tables for the decode position
        pos = kv_len
        rdim = spec.qk_rope_head_dim if spec.mla else shapes.head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, rdim // 2, device=device, dtype=torch.float32) / (rdim // 2)))
        self.cos = torch.cos(pos * inv).to(dt)
        self.sin = torch.sin(pos * inv).to(dt)
        self.pos = torch.tensor([pos], device=device)
        self.act_fn = _act_fn(spec)
        layer_no = 0
        for kind in shapes.kinds:  # keep the model's order of kinds, simulated count of each
            for _ in range(plan.get(kind, 0)):
                self._layer(kind, layer_no)
                layer_no += 1
        self.layers_simulated = layer_no
        fn_w = torch.ones(h, dtype=dt, device=device)

        def final_norm(S):
            S["x"] = F.rms_norm(S["x"], (h,), fn_w, eps)

        def lm_head(S):
            S["logits"] = F.linear(S["x"], lm)

        self.ops += [Op("final norm", "head", final_norm), Op("lm_head", "head", lm_head)]
        if group is not None:
            self.ops.append(Op("all-reduce", "head", self._allgather_logits()))
        self.ops.append(Op("sampling", "head", self._sampler(sampling)))

    # -- pieces ------------------------------------------------------------------------------------------

    def _allreduce(self, key):
        dist = __import__("torch.distributed", fromlist=["all_reduce"])
        group = self.group

        def op(S):
            dist.all_reduce(S[key], group=group)

        return op

    def _allgather_logits(self):
        torch = self.torch
        dist = __import__("torch.distributed", fromlist=["all_gather_into_tensor"])
        group = self.group
        world = dist.get_world_size(group)

        def op(S):
            # The gather reads this rank's shard and writes the full logits under another key: an op timed
            # on its own runs back to back, and gathering its own output would double the logits every call.
            lg = S["logits"].contiguous()
            out = S.get("logits_gathered")
            if out is None or out.shape[1:] != lg.shape:
                out = S["logits_gathered"] = torch.empty((world,) + tuple(lg.shape), dtype=lg.dtype, device=lg.device)
            if lg.is_cuda:
                dist.all_gather_into_tensor(out, lg, group=group)
            else:
                dist.all_gather(list(out.unbind(0)), lg, group=group)
            S["logits_full"] = out.permute(1, 0, 2).reshape(lg.shape[0], -1)

        return op

    def _sampler(self, sampling: str):
        torch = self.torch

        if sampling == "greedy":
            def op(S):
                S["tok"].copy_(torch.argmax(S.get("logits_full", S["logits"]), dim=-1))
            return op

        top_p = 0.95

        def op(S):  # top-p over the full vocabulary, then an exponential race (graph-safe multinomial)
            probs = torch.softmax(S.get("logits_full", S["logits"]).float(), dim=-1)
            sp, idx = torch.sort(probs, dim=-1, descending=True)
            keep = (torch.cumsum(sp, dim=-1) - sp) < top_p
            sp = sp * keep
            race = sp / torch.empty_like(sp).exponential_()
            S["tok"].copy_(idx.gather(-1, torch.argmax(race, dim=-1, keepdim=True)).squeeze(-1))

        return op

    def _lin(self, name: str) -> Linear:
        l = self.shapes.linears[name]
        kind = self.lin_kind if l.quantizable else self.act
        lin = Linear(l.n, l.k, kind, self.act, self.device, m=self.shapes.batch, pad_m=self.pad_m)
        self.weight_bytes += lin.nbytes
        return lin

    def _norm_w(self, n):
        return self.torch.ones(n, dtype=_tdtype(self.act), device=self.device)

    def _layer(self, kind: str, i: int) -> None:
        torch, F, spec, sh = self.torch, self.torch.nn.functional, self.spec, self.shapes
        M, h, eps = sh.batch, spec.hidden, self.eps
        mlp_kind, attn_kind = kind.split("/")
        seg = kind
        add = self.ops.append
        w_in, w_post = self._norm_w(h), self._norm_w(h)
        gemma = spec.family == "gemma3"
        w_pa, w_pf = (self._norm_w(h), self._norm_w(h)) if gemma else (None, None)
        dt = _tdtype(self.act)
        T_att = min(self.T, spec.sliding_window) if attn_kind == "sliding" else self.T

        def norm_in(S):
            S["h"] = F.rms_norm(S["x"], (h,), w_in, eps)

        add(Op("norms", seg, norm_in))
        if spec.mla:
            self._mla(seg, T_att)
        else:
            self._gqa(seg, T_att)
        if self.group is not None:
            add(Op("all-reduce", seg, self._allreduce("o")))

        def norm_post(S):
            o = F.rms_norm(S["o"], (h,), w_pa, eps) if gemma else S["o"]
            S["x"] = S["x"] + o
            S["h"] = F.rms_norm(S["x"], (h,), w_post, eps)

        add(Op("norms", seg, norm_post))
        if mlp_kind == "dense":
            gu, dn = self._lin("mlp.gate_up_proj"), self._lin("mlp.down_proj")
            act = self.act_fn

            def mlp(S):
                S["o"] = dn(act(gu(S["h"])))

            add(Op("mlp", seg, mlp))
        else:
            self._moe(seg)
        if self.group is not None:
            add(Op("all-reduce", seg, self._allreduce("o")))

        def norm_out(S):
            o = F.rms_norm(S["o"], (h,), w_pf, eps) if gemma else S["o"]
            S["x"] = S["x"] + o

        add(Op("norms", seg, norm_out))

    def _gqa(self, seg: str, T_att: int) -> None:
        torch, F, spec, sh = self.torch, self.torch.nn.functional, self.spec, self.shapes
        M, H, KV, D = sh.batch, sh.heads, sh.kv_heads, sh.head_dim
        qkv, o = self._lin("attn.qkv_proj"), self._lin("attn.o_proj")
        dt = _tdtype(self.act)
        kc = _rand((M, KV, self.T, D), self.act, self.device)
        vc = _rand((M, KV, self.T, D), self.act, self.device)
        self.kv_bytes += 2 * M * KV * T_att * D * kc.element_size()
        qn = self._norm_w(D) if spec.qk_norm else None
        kn = self._norm_w(D) if spec.qk_norm else None
        cos, sin, pos, eps = self.cos, self.sin, self.pos, self.eps
        start = self.T - T_att
        scale = 1.0 / math.sqrt(float((spec.raw or {}).get("query_pre_attn_scalar") or D))

        def proj(S):
            S["qkv"] = qkv(S["h"])

        def attend(S):
            q, k, v = S["qkv"].split([H * D, KV * D, KV * D], dim=-1)
            q, k, v = q.view(M, H, 1, D), k.view(M, KV, 1, D), v.view(M, KV, 1, D)
            if qn is not None:
                q = F.rms_norm(q, (D,), qn, eps)
                k = F.rms_norm(k, (D,), kn, eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc[:, :, start:], vc[:, :, start:], scale=scale, enable_gqa=KV != H)
            S["attn"] = a.reshape(M, H * D)

        def out(S):
            S["o"] = o(S["attn"])

        self.ops += [Op("attention projections", seg, proj), Op("attention", seg, attend),
                     Op("attention projections", seg, out)]

    def _mla(self, seg: str, T_att: int) -> None:
        torch, F, spec, sh = self.torch, self.torch.nn.functional, self.spec, self.shapes
        M, H, h, eps = sh.batch, sh.heads, spec.hidden, self.eps
        nope, rope, lora, vd = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank, spec.v_head_dim
        ql = spec.q_lora_rank
        L = self.shapes.linears
        q_a = self._lin("attn.q_a_proj") if ql else None
        q_b = self._lin("attn.q_b_proj") if ql else self._lin("attn.q_proj")
        kv_a, o = self._lin("attn.kv_a_proj"), self._lin("attn.o_proj")
        # kv_b_proj in its absorbed form: W_UK [H, nope, lora] and W_UV [H, lora, v] (bf16 batched GEMVs)
        w_uk = _rand((H, nope, lora), self.act, self.device)
        w_uv = _rand((H, lora, vd), self.act, self.device)
        self.weight_bytes += (w_uk.numel() + w_uv.numel()) * w_uk.element_size()
        qa_norm = self._norm_w(ql) if ql else None
        kv_norm = self._norm_w(lora)
        cache = _rand((M, self.T, lora + rope), self.act, self.device)
        self.kv_bytes += M * T_att * (lora + rope) * cache.element_size()
        cos, sin, pos = self.cos, self.sin, self.pos
        scale = 1.0 / math.sqrt(nope + rope)
        idx = None
        if spec.index_heads:
            IH, ID = spec.index_heads, spec.index_head_dim
            wq = self._lin("attn.indexer.wq_b")
            wk = self._lin("attn.indexer.wk")
            wp = self._lin("attn.indexer.weights_proj")
            icache = _rand((M, self.T, ID), self.act, self.device)
            self.kv_bytes += M * T_att * ID * icache.element_size()
            kn_w, kn_b = self._norm_w(ID), torch.zeros(ID, dtype=_tdtype(self.act), device=self.device)
            topk = min(spec.index_topk or self.T, self.T)
            idx = (IH, ID, wq, wk, wp, icache, kn_w, kn_b, topk)

        def proj(S):
            x = S["h"]
            if q_a is not None:
                S["q_in"] = F.rms_norm(q_a(x), (ql,), qa_norm, eps)
                q = q_b(S["q_in"])
            else:
                S["q_in"] = x
                q = q_b(x)
            S["q"] = q.view(M, H, nope + rope)
            S["kv"] = kv_a(x)

        def attend(S):
            q = S["q"]
            q_nope, q_pe = q.split([nope, rope], dim=-1)
            lat, k_pe = S["kv"].split([lora, rope], dim=-1)
            lat = F.rms_norm(lat, (lora,), kv_norm, eps)
            k_pe = _rope(k_pe, cos, sin)
            cache.index_copy_(1, pos, torch.cat((lat, k_pe), dim=-1).unsqueeze(1))
            q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [M, H, lora]
            qq = torch.cat((q_lat, _rope(q_pe, cos, sin)), dim=-1)  # [M, H, lora+rope]
            kv = cache
            if idx is not None:
                IH, ID, wq, wk, wp, icache, kn_w, kn_b, topk = idx
                qi = wq(S["q_in"]).view(M, IH, ID)
                ki = F.layer_norm(wk(S["h"]), (ID,), kn_w, kn_b)
                icache.index_copy_(1, pos, ki.unsqueeze(1))
                wts = wp(S["h"]).float()  # [M, IH]
                sc = torch.relu(torch.bmm(qi, icache.transpose(1, 2))).float()  # [M, IH, T]
                score = (sc * wts.unsqueeze(-1)).sum(1)
                if topk < self.T:
                    sel = torch.topk(score, topk, dim=-1).indices
                    kv = cache.gather(1, sel.unsqueeze(-1).expand(-1, -1, lora + rope))
            s = torch.bmm(qq, kv.transpose(1, 2)).float() * scale  # [M, H, T]
            p = torch.softmax(s, dim=-1).to(qq.dtype)
            o_lat = torch.bmm(p, kv[..., :lora])  # [M, H, lora]
            S["attn_lat"] = o_lat

        def out(S):
            o_v = torch.bmm(S["attn_lat"].transpose(0, 1), w_uv).transpose(0, 1)  # [M, H, v]
            S["o"] = o(o_v.reshape(M, H * vd))

        self.ops += [Op("attention projections", seg, proj), Op("attention", seg, attend),
                     Op("attention projections", seg, out)]

    def _moe(self, seg: str) -> None:
        torch, F, spec, sh = self.torch, self.torch.nn.functional, self.spec, self.shapes
        raw = spec.raw or {}
        router = self._lin("moe.router")
        E, k = sh.experts, sh.top_k
        bias = torch.zeros(E, dtype=torch.float32, device=self.device) if spec.family == "deepseek_v3" else None
        n_group = int(raw.get("n_group") or 1) if spec.family == "deepseek_v3" else 1
        topk_group = int(raw.get("topk_group") or n_group)
        if E % n_group or sh.ep > 1:
            n_group = 1
        norm = bool(raw.get("norm_topk_prob", True))
        rscale = float(raw.get("routed_scaling_factor", 1.0) or 1.0)
        sigmoid = spec.scoring == "sigmoid"
        shared = None
        if sh.shared_inter:
            shared = (self._lin("moe.shared.gate_up_proj"), self._lin("moe.shared.down_proj"))
        experts = Experts(E, sh.moe_inter, spec.hidden, self.experts_kind, self.act, self.device, self.moe_backend)
        # only the experts a token hits are read; count those bytes (all of them are allocated)
        self.weight_bytes += experts.per_expert_bytes * min(E, k * sh.batch)
        act = self.act_fn
        M = sh.batch

        def route(S):
            logits = router(S["h"]).float()
            scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
            choice = scores + bias if bias is not None else scores
            if n_group > 1:
                g = choice.view(M, n_group, -1).topk(2, dim=-1).values.sum(-1)
                keep = torch.zeros_like(g).scatter_(1, g.topk(topk_group, dim=-1).indices, 1.0)
                mask = keep.unsqueeze(-1).expand(M, n_group, E // n_group).reshape(M, E)
                choice = choice.masked_fill(mask == 0, float("-inf"))
            ids = torch.topk(choice, k, dim=-1).indices
            w = scores.gather(1, ids)
            if norm:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            S["ids"], S["w"] = ids, w * rscale

        def shared_fn(S):
            S["sh"] = shared[1](act(shared[0](S["h"])))

        def routed(S):
            y = experts(S["h"], S["ids"], S["w"], act)
            S["o"] = y + S["sh"] if shared is not None else y

        self.ops.append(Op("router", seg, route))
        if shared is not None:
            self.ops.append(Op("shared expert", seg, shared_fn))
        self.ops.append(Op("routed experts", seg, routed))

    # -- running ------------------------------------------------------------------------------------------

    def runner(self, select: Callable[[Op], bool]) -> Callable[[], None]:
        fns = [op.fn for op in self.ops if select(op)]
        S = self.S

        def run():
            for fn in fns:
                fn(S)

        return run


# ----------------------------------------------------------------------------------------------------------
# measuring


def _measure(step: DecodeStep, select, settings: KernelSettings, flusher, on_gpu: bool, barrier) -> dict[str, Any]:
    run = step.runner(select)
    if not on_gpu:
        samples = time_cpu(run, settings.warmup, settings.iters, before=barrier)
        return {"eager": spread(samples), "graph": None}
    eager = time_cuda(run, settings.warmup, settings.iters, flusher, before=barrier)
    out: dict[str, Any] = {"eager": spread(eager), "graph": None}
    try:
        g = capture_graph([run])
        graph = time_cuda(g.replay, settings.warmup, settings.iters, flusher, before=barrier)
        out["graph"] = spread(graph)
        del g
    except Exception as exc:
        out["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


def _median(m: dict | None) -> float | None:
    return None if not m else m.get("median_ms")


def _device_name(device: str) -> str:
    torch = _torch()
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from ..host import cpu_model

    return f"cpu: {cpu_model()}"


def _fits(shapes: StepShapes, fmt: dict, device: str, settings: KernelSettings, world: int = 1) -> int | None:
    """Layers that fit in the device memory budget ("auto"), or the CPU's small default."""
    torch = _torch()
    wb = {"fp8": 1.0, "bf16": 2.0, "fp32": 4.0, "nvfp4-wo": 2.0}[fmt["linear"]]  # nvfp4: bf16 scratch at init
    ab = {"bf16": 2.0, "fp32": 4.0}[fmt["activations"]]
    per = max(layer_bytes(shapes, k, wb, ab, shapes.context_len + 1) for k in shapes.kinds)
    head = (1 if shapes.spec.tie_embeddings else 2) * shapes.vocab * shapes.spec.hidden * ab
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        budget = free * settings.memory_fraction - head - 2 * 1024**3
    else:
        import psutil

        budget = psutil.virtual_memory().available * 0.4 / max(1, world) - head  # ranks share the host memory
        return max(0, min(settings.cpu_auto_layers, int(budget // per))) if budget > 0 else 0
    return max(0, int(budget // per))


def simulate_rank(spec: ModelSpec, settings: KernelSettings, device: str, group=None) -> dict[str, Any]:
    """Build and time the step on this rank. Rank 0's dict is the result."""
    torch = _torch()
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    torch.manual_seed(0)
    shapes = step_shapes(spec, settings.tp, settings.ep, settings.batch, settings.context_len)
    fmt = probe_formats(settings.weight_format, device)
    if fmt.get("experts_stand_in") and spec.is_moe:
        fmt = {**fmt, "format_match": False,
               "stand_in": f"routed experts run bf16 stand-in weights (no grouped {settings.weight_format} kernel here)"}
    fits = _fits(shapes, fmt, device, settings, group.size() if group is not None else 1)
    if fits is not None and fits < len(shapes.kinds) and settings.layers == "auto":
        raise DecodeGapError(
            f"simulate: not even one layer of each kind of {spec.name} fits on {device} "
            f"(budget allows {fits}); set simulate.layers or use a larger device"
        )
    plan = plan_layers(shapes, settings.layers, fits)
    world = group.size() if group is not None else 1
    barrier: Callable[[], None] = (lambda: torch.distributed.barrier(group=group)) if group is not None else (lambda: None)
    with torch.inference_mode():
        step = DecodeStep(shapes, plan, fmt, device, settings.context_len, settings.sampling,
                          group=group if world > 1 else None)
        flusher = L2Flusher(device) if on_gpu else None
        # one full step first so that every buffer (routing ids, logits) holds valid values
        step.runner(lambda op: True)()
        if on_gpu:
            torch.cuda.synchronize()
        full = _measure(step, lambda op: True, settings, flusher, on_gpu, barrier)
        segments = {}
        for seg in ["head"] + list(plan):
            segments[seg] = _measure(step, lambda op, s=seg: op.segment == s, settings, flusher, on_gpu, barrier)
        comp: dict[tuple[str, str], dict] = {}
        for c in COMPONENT_ORDER:
            for seg in ["head"] + list(plan):
                if any(op.component == c and op.segment == seg for op in step.ops):
                    comp[(c, seg)] = _measure(step, lambda op, c=c, s=seg: op.component == c and op.segment == s,
                                              settings, flusher, on_gpu, barrier)
    counts = shapes.kinds
    scale_by_kind = {k: counts[k] / plan[k] for k in plan}

    def scaled(mode: str, table: dict[str, dict]) -> float | None:
        total = 0.0
        for seg, m in table.items():
            v = _median(m.get(mode))
            if v is None:
                return None
            total += v * (1.0 if seg == "head" else scale_by_kind[seg])
        return total

    eager_ms = scaled("eager", segments)
    graph_ms = scaled("graph", segments) if on_gpu else None
    graph_errors = sorted({m["graph_error"] for m in [full, *segments.values(), *comp.values()] if m.get("graph_error")})
    components = []
    for c in COMPONENT_ORDER:
        parts = {seg: m for (cc, seg), m in comp.items() if cc == c}
        if not parts:
            continue
        e = scaled("eager", parts)
        g = scaled("graph", parts) if on_gpu else None
        components.append({
            "name": c, "ms": g if g is not None else e, "eager_ms": e, "graph_ms": g, "status": "measured",
            "source": "simulate_kernel: " + ("CUDA-graph replay" if g is not None else "eager wall time") +
                      (f" over {world} ranks ({'nccl' if on_gpu else 'gloo'})" if c == "all-reduce" else ""),
        })
    # one rank standing for tp GPUs: the collectives are modelled from the measured all-reduce
    allreduce = {"mode": "none", "collectives_per_token": shapes.collectives_per_token}
    if world > 1:
        allreduce.update(mode="real", world_size=world, backend="nccl" if on_gpu else "gloo")
    elif settings.tp > 1:
        if settings.allreduce_us is not None:
            ms = shapes.collectives_per_token * settings.allreduce_us / 1000.0
            components.append({
                "name": "all-reduce", "ms": ms, "eager_ms": ms, "graph_ms": ms if on_gpu else None,
                "status": "modelled",
                "source": f"{settings.allreduce_source}: {shapes.collectives_per_token} x "
                          f"{settings.allreduce_us:.2f} us (measured all-reduce at the model's message size)",
            })
            allreduce.update(mode="modelled", us_each=settings.allreduce_us, ms=ms, source=settings.allreduce_source)
            eager_ms = eager_ms + ms if eager_ms is not None else None
            graph_ms = graph_ms + ms if graph_ms is not None else None
        else:
            allreduce.update(mode="unavailable", why=settings.allreduce_why or "no all-reduce measurement")
            components.append({"name": "all-reduce", "ms": None, "eager_ms": None, "graph_ms": None,
                               "status": "unavailable", "why": allreduce["why"], "source": "microbench/allreduce.json"})
    layers_total = spec.layers
    layers_sim = sum(plan.values())
    kv_read = sum(
        shapes.batch * (min(settings.context_len + 1, spec.sliding_window) if k.endswith("sliding") else settings.context_len + 1)
        * kv_row_elems(shapes) * {"bf16": 2, "fp32": 4}[fmt["activations"]] * n
        for k, n in counts.items()
    )
    backend = (f"torch {torch.__version__} " + ("CUDA eager + CUDA graph" if on_gpu else "CPU eager") +
               f"; linear {fmt['linear']}" + (f"; MoE {step.moe_backend}" if step.moe_backend else "") +
               "; attention " + ("MLA absorbed (bmm)" if spec.mla else "SDPA"))
    graph_reason = None
    if not on_gpu:
        graph_reason = "CUDA graphs need a GPU: on a CPU the step runs eagerly only"
    elif graph_ms is None:
        graph_reason = "CUDA-graph capture failed: " + "; ".join(graph_errors)
    result = {
        "stage": "simulate_kernel",
        "status": "ok",
        "device": _device_name(device),
        "backend": backend,
        "model": spec.name,
        "tp": settings.tp, "ep": settings.ep, "batch_size": settings.batch, "context_len": settings.context_len,
        "weight_format": settings.weight_format,
        "dtypes": {"linear": fmt["linear"], "activations": fmt["activations"], "kv_cache": fmt["activations"]},
        "format_match": fmt["format_match"],
        "stand_in": fmt["stand_in"],
        "moe_backend": step.moe_backend or None,
        "sampling": settings.sampling,
        "eager_ms": eager_ms,
        "graph_ms": graph_ms,
        "graph_reason": graph_reason,
        "launch_overhead_ms": (eager_ms - graph_ms) if (eager_ms is not None and graph_ms is not None) else None,
        "components": components,
        "components_sum_ms": sum(c["ms"] for c in components if c["ms"] is not None),
        "layers_total": layers_total,
        "layers_simulated": layers_sim,
        "scale": layers_total / layers_sim,
        "scale_by_kind": scale_by_kind,
        "layers_by_kind": {k: {"total": counts[k], "simulated": plan[k]} for k in plan},
        "raw": {"layers": layers_sim, "eager": full["eager"], "graph": full["graph"]},
        "segments": {seg: {"eager": m["eager"], "graph": m["graph"],
                           "scale": 1.0 if seg == "head" else scale_by_kind[seg]} for seg, m in segments.items()},
        "allreduce": allreduce,
        "bytes_per_step_simulated": step.weight_bytes + step.kv_bytes,
        "kv_bytes_per_step": kv_read,
        "world_size": world,
        "settings": {"warmup": settings.warmup, "iters": settings.iters, "layers": settings.layers,
                     "l2_flush": bool(on_gpu)},
        "notes": list(shapes.notes) + ([fmt["note"]] if fmt.get("note") else []),
        "skipped": [],
        "provenance": {
            "eager_ms": "measured: eager step, " + ("CUDA events from an idle GPU" if on_gpu else "wall time") +
                        (", scaled by layer kind" if layers_sim < layers_total else ""),
            "graph_ms": ("measured: CUDA-graph replay, CUDA events" if graph_ms is not None
                         else f"unavailable: {graph_reason}"),
        },
    }
    if not fmt["format_match"]:
        result["skipped"].append({"case": f"{settings.weight_format} kernels", "reason": fmt["stand_in"]})
    if graph_reason:
        result["skipped"].append({"case": "CUDA graph", "reason": graph_reason})
    return result


# ----------------------------------------------------------------------------------------------------------
# entry point (one rank, or several through torch.distributed)


RANK_MODULE = "decode_gap.simulate.kernel_rank"


def rank_body(rank: int, job: dict[str, Any]) -> None:
    """One rank of the simulated step (started by `decode_gap.ranks.launch`); rank 0 writes the result."""
    import torch
    import torch.distributed as dist

    from ..ranks import load_payload, write_result

    spec, settings = load_payload(job)
    world, backend = job["world_size"], job["backend"]
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    else:
        torch.cuda.set_device(rank)
    kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=job["init_method"], rank=rank, world_size=world, **kwargs)
    try:
        result = simulate_rank(spec, settings, device, group=dist.group.WORLD)
        if rank == 0:
            write_result(job, rank, result)
    finally:
        dist.destroy_process_group()


def pick_device(settings: KernelSettings) -> str:
    torch = _torch()
    if settings.device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda:0"
    if settings.device == "cuda":
        raise DecodeGapError("config field 'simulate.device': cuda requested but torch sees no GPU")
    return "cpu"


def simulate_kernel(spec: ModelSpec, settings: KernelSettings) -> dict[str, Any]:
    """Run the kernel level: one rank, or `tp` ranks with the real all-reduce when that many are available."""
    torch = _torch()
    device = pick_device(settings)
    world = 1
    if settings.ranks is not None:
        world = settings.ranks if settings.ranks in (1, settings.tp) else 1
    elif settings.tp > 1:
        if device.startswith("cuda") and torch.cuda.device_count() >= settings.tp:
            world = settings.tp
        elif not device.startswith("cuda"):
            world = settings.tp  # gloo ranks on the CPU
    if world == 1:
        return simulate_rank(spec, settings, device)
    from ..ranks import launch

    backend = "nccl" if device.startswith("cuda") else "gloo"
    results = launch(RANK_MODULE, {"backend": backend}, world, settings.timeout_s, "simulate_kernel",
                     payload=(spec, settings))
    if 0 not in results:
        raise DecodeGapError(f"simulate_kernel: rank 0 of {world} exited without writing the step's result")
    return results[0]
