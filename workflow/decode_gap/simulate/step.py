"""Kernel level: the op list of one decode step (attention, all-reduces, MLP or MoE, head) for the simulated
layers; `DecodeStep.runner(select)` runs the selected ops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..model import MLA_FUSED_A, ModelSpec
from ..errors import DecodeGapError
from ..kernels import attention as attn_kernels
from ..kernels import norm as norm_kernels
from ..kernels import topk as topk_kernels
from ..kernels.lowprec import available
from ..kernels.nvfp4 import E4M3_MAX
from ..kernels.routing import FusedRoute, Routing, fused_fits, route_reference, with_shared_slot
from .formats import FUSED_K_MULTIPLE, GROUPED_GEMV_KINDS, _probe_grouped, _torch, fused_moe_fallback
from .layers import Experts, KernelPicker, Linear, _rand, _tdtype
from .shapes import StepShapes

# the largest batch at which the shared expert runs as one more expert of the fused MoE, by its form. NVFP4: the
# kernel level's GLM-5-NVFP4 TP8 step (benchmarks/device/issue14_pending.sh shared; H100, 2026-12-05), apart / fused:
# 8 rows 14.25 / 13.60 ms (routed experts 5.06 -> 5.42, the shared expert's 0.98 gone), 32 rows 24.70 / 23.85 (12.68
# -> 12.71, its 1.12 gone); the H200 (2026-12-05, down walking: DOWN_WALK), 8 rows 13.23 / 12.33 (46 layers a graph,
# median 7.795 / 7.282 ms, p99 7.818 / 7.309), 32 rows 21.79 / 20.53 (12.894 / 12.203, p99 12.945 / 12.246); untimed
# above 32. fp8: it lost at 8 rows (step._moe's figures, before the align without a sort and down's pair, which are
# NVFP4's), so batch 1 only
FUSE_SHARED_MAX_BATCH = {"nvfp4-moe": 32, "fp8-moe": 1, "fp8-block-moe": 1}

# ----------------------------------------------------------------------------------------------------------
# the step


@dataclass
class Op:
    component: str
    segment: str  # "head" or a layer kind
    fn: Callable[[dict], None]


def _indexer_impl(fp8_keys: bool) -> str:
    """How the step runs a DSA indexer, by whether it caches FP8 keys (a copy of the step may cache bf16 ones)."""
    if fp8_keys:
        return "key norm, rope, Hadamard, FP8 cast and cache append one kernel; FP8 keys and queries, an FP8 dot"
    return "key norm, rope and cache append one kernel; keys and queries in the activations' dtype"


def _gather_rows(cache, rows):
    """The cache rows [M, n, W] at `rows` [M, n] (DSA's selection) as a new tensor: the torch path's sparse read."""
    return cache.gather(1, rows.long().unsqueeze(-1).expand(-1, -1, cache.shape[-1]))


def _act_fn(spec: ModelSpec):
    torch = _torch()
    F = torch.nn.functional
    act = (spec.raw or {}).get("hidden_activation") or (spec.raw or {}).get("hidden_act") or "silu"

    def glu(h):
        g, u = h.chunk(2, dim=-1)
        return (F.gelu(g, approximate="tanh") if "gelu" in act else F.silu(g)) * u

    return glu


class DecodeStep:
    """Builds the tensors and the op list of one decode step for the simulated layers."""

    def __init__(self, shapes: StepShapes, plan: dict[str, int], fmt: dict[str, Any], device: str,
                 kv_len: int, sampling: str, group=None, fused: bool | None = None) -> None:
        torch = _torch()
        self.torch, self.shapes, self.plan, self.device, self.group = torch, shapes, plan, device, group
        spec = shapes.spec
        self.spec = spec
        self.act = fmt["activations"]
        self.lin_kind = fmt["linear"]
        probed = fmt.get("experts", fmt["linear"])
        self.experts_kind = fused_moe_fallback(probed, spec.hidden, shapes.moe_inter) if spec.is_moe else probed
        self.experts_note = (f"routed experts run {self.experts_kind}, not the fused MoE ({probed}): hidden "
                             f"{spec.hidden} and {shapes.moe_inter} intermediate rows a GPU are not whole multiples "
                             f"of its K steps" if self.experts_kind != probed else "")
        self.pad_m = int(fmt.get("pad_m", 0))
        self.moe_backend = _probe_grouped(device, self.experts_kind) if spec.is_moe else ""
        # at batch 1, each linear shape keeps the faster of our GEMV and the library's: fp8 per-tensor against
        # torch._scaled_mm, and the bf16 linears on a GPU (the router, the indexer's weights, every linear of a bf16
        # model) against cuBLAS, as engines give the router a GEMV of its own (SGLang's dsv3_router_gemm). H200,
        # GLM-5 TP8: 7.5 against 9.6 us (256x6144), 6.1 against 8.5 (32x6144); at 8 rows our bf16 GEMV took
        # 114-230 us against cuBLAS's 8-10, so it is no candidate there.
        bf16_gemv = device.startswith("cuda") and available(device) and shapes.batch == 1
        # fp8 at any batch (our GEMV at batch 1, above it cuBLAS's blockwise form or `_scaled_mm`) against our fp8
        # tensor-core GEMV, each shape timed once
        fp8 = self.lin_kind in ("fp8", "fp8-block", "fp8-block-mm") and device.startswith("cuda")
        self.picker = KernelPicker(device) if self.lin_kind == "fp8-gemv" or bf16_gemv or fp8 else None
        # norms (the residual add fused in), the rotary embedding and MLA's attention as Triton kernels on a GPU, as
        # engines run them; else torch ops (`fused` forces either: the tests run the fused step in the interpreter)
        self.fused = (device.startswith("cuda") and available(device)) if fused is None else fused
        self.rms = norm_kernels.rms_norm if self.fused else norm_kernels.rms_norm_reference
        self.add_rms = norm_kernels.add_rms_norm if self.fused else norm_kernels.add_rms_norm_reference
        # decode attention: our split-KV kernel or torch's, whichever is faster for the step's shape (H200,
        # benchmarks/attention_device.py: the split kernel at one sequence, cuDNN's SDPA at 8 sequences of 4k-32k)
        self.attn_picker = KernelPicker(device) if self.fused else None
        self.attention_impl = "MLA absorbed (bmm)" if spec.mla else "SDPA"
        self.routing_impl = ""  # MoE: the routing as one Triton kernel where fused (and it fits), else torch ops
        self.shared_note = ""  # MoE: where the shared expert runs inside the fused MoE (_moe)
        M, h = shapes.batch, spec.hidden
        self.kv_len = kv_len
        self.T = kv_len + 1  # the new token attends to the cache and itself
        dt = _tdtype(self.act)
        self.weight_bytes = 0.0
        self.kv_bytes = 0.0
        eps = float((spec.raw or {}).get("rms_norm_eps", 1e-6) or 1e-6)
        self.eps = eps
        # state shared by the ops (values do not matter, shapes do), but for the tokens: a batch's rows decode
        # different ones, as a server's do. Rows alike would route alike, and a MoE step would read top_k experts
        # where a batch of B reads up to B x top_k (DeepSeek-V3 TP8, batch 8: 8 of the 64 its bytes count)
        S: dict[str, Any] = {"tok": torch.randperm(shapes.vocab, device=device)[:M] if M > 1 else
                             torch.zeros(M, dtype=torch.long, device=device)}
        self.S = S
        self.ops: list[Op] = []
        # embedding (vocab-parallel under TP) and the lm_head (the same matrix when tied)
        emb = _rand((shapes.vocab, h), self.act, device)
        self.weight_bytes += h * emb.element_size() * M  # one row per token is read
        lm = emb if spec.tie_embeddings else _rand((shapes.vocab, h), self.act, device)
        self.weight_bytes += lm.numel() * lm.element_size()
        # Gemma 3 scales its embedding and norms each sublayer's output before the residual add (no add to carry)
        self.gemma = spec.family == "gemma3"
        scale = math.sqrt(h) if self.gemma else 1.0
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

        def final_norm(S):  # with the last layer's output added to the residual first (but for Gemma 3's)
            if self.gemma or not layer_no:
                S["x"] = self.rms(S["x"], fn_w, eps)
            else:
                S["x"] = self.add_rms(S["x"], S["o"], fn_w, eps)[1]

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
        lin = Linear(l.n, l.k, kind, self.act, self.device, m=self.shapes.batch, pad_m=self.pad_m, picker=self.picker)
        self.weight_bytes += lin.nbytes
        return lin

    def _norm_w(self, n):
        return self.torch.ones(n, dtype=_tdtype(self.act), device=self.device)

    def _layer(self, kind: str, i: int) -> None:
        spec, h, eps = self.spec, self.spec.hidden, self.eps
        mlp_kind, attn_kind = kind.split("/")
        seg = kind
        add = self.ops.append
        w_in, w_post = self._norm_w(h), self._norm_w(h)
        gemma = self.gemma
        w_pa, w_pf = (self._norm_w(h), self._norm_w(h)) if gemma else (None, None)
        T_att = min(self.T, spec.sliding_window) if attn_kind == "sliding" else self.T

        rms, add_rms = self.rms, self.add_rms
        # the last layer's output joins the residual in this layer's input norm (one kernel, as engines fuse it);
        # the first layer has none yet, and Gemma 3 norms its output before the add (norm_out). H100, GLM-5-NVFP4
        # TP8 (benchmarks/simulate_gpu.py, 25 of 78 layers, two rounds): norms 0.65 -> 0.52 ms a step, the step
        # 7.32 -> 7.20 ms at 1 row, 12.22 -> 12.08 at 8
        carried = i > 0 and not gemma

        def norm_in(S):
            if carried:
                S["x"], S["h"] = add_rms(S["x"], S["o"], w_in, eps)
            else:
                S["h"] = rms(S["x"], w_in, eps)

        add(Op("norms", seg, norm_in))
        if spec.mla:
            self._mla(seg, T_att)
        else:
            self._gqa(seg, T_att)
        if self.group is not None:
            add(Op("all-reduce", seg, self._allreduce("o")))

        def norm_post(S):
            o = rms(S["o"], w_pa, eps) if gemma else S["o"]
            S["x"], S["h"] = add_rms(S["x"], o, w_post, eps)

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

        if gemma:
            def norm_out(S):
                S["x"] = S["x"] + rms(S["o"], w_pf, eps)

            add(Op("norms", seg, norm_out))

    def _gqa(self, seg: str, T_att: int) -> None:
        torch, spec, sh = self.torch, self.spec, self.shapes
        M, H, KV, D = sh.batch, sh.heads, sh.kv_heads, sh.head_dim
        qkv, o = self._lin("attn.qkv_proj"), self._lin("attn.o_proj")
        kc = _rand((M, KV, self.T, D), self.act, self.device)
        vc = _rand((M, KV, self.T, D), self.act, self.device)
        self.kv_bytes += 2 * M * KV * T_att * D * kc.element_size()
        qn = self._norm_w(D) if spec.qk_norm else None
        kn = self._norm_w(D) if spec.qk_norm else None
        cos, sin, pos, eps = self.cos, self.sin, self.pos, self.eps
        start = self.T - T_att
        scale = 1.0 / math.sqrt(float((spec.raw or {}).get("query_pre_attn_scalar") or D))
        kw, vw = kc[:, :, start:], vc[:, :, start:]  # the rows a sliding window reads (all of them otherwise)
        # on a GPU: the qk-norm, rope and both cache writes as one kernel, then split-KV decode attention, as
        # engines run them (FlashInfer, FlashAttention's decode split, vLLM's and SGLang's Triton decode kernels)
        prepare = attn_kernels.qkv_rope_append if self.fused else attn_kernels.qkv_rope_append_reference
        decode = None
        if self.fused:
            try:
                split = attn_kernels.GqaDecode(M, H, KV, D, T_att, self.device, _tdtype(self.act))
            except DecodeGapError:  # a head_dim or group the kernel does not take: torch's fused SDPA
                split = None
            if split is not None:
                qt = torch.zeros((M, H, D), dtype=_tdtype(self.act), device=self.device)  # no RNG draw
                choice = self.attn_picker.pick(("gqa", M, H, KV, D, T_att), {
                    split.label: lambda: split(qt, kw, vw, scale),
                    "torch SDPA": lambda: attn_kernels.reference_gqa(qt, kw, vw, scale)})
                decode = split if choice == split.label else None
            self.attention_impl = (f"GQA ({decode.label if decode else 'torch SDPA'}; qk-norm, rope and cache "
                                   "append one kernel)")

        def proj(S):
            S["qkv"] = qkv(S["h"])

        def attend(S):
            q = prepare(S["qkv"], H, kc, vc, pos, cos, sin, qn, kn, eps)  # [M, H, D]
            a = decode(q, kw, vw, scale) if decode is not None else attn_kernels.reference_gqa(q, kw, vw, scale)
            S["attn"] = a.reshape(M, H * D)

        def out(S):
            S["o"] = o(S["attn"])

        self.ops += [Op("attention projections", seg, proj), Op("attention", seg, attend),
                     Op("attention projections", seg, out)]

    def _mla(self, seg: str, T_att: int) -> None:
        torch, spec, sh = self.torch, self.spec, self.shapes
        M, H, eps = sh.batch, sh.heads, self.eps
        nope, rope, lora, vd = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank, spec.v_head_dim
        ql = spec.q_lora_rank
        L = self.shapes.linears
        # q_a and kv_a as one GEMV where the shapes fuse them (model.fuse_mla_a_projections), as the engines do
        qkv_a = self._lin(f"attn.{MLA_FUSED_A}") if f"attn.{MLA_FUSED_A}" in L else None
        q_a = self._lin("attn.q_a_proj") if ql and qkv_a is None else None
        q_b = self._lin("attn.q_b_proj") if ql else self._lin("attn.q_proj")
        kv_a = self._lin("attn.kv_a_proj") if qkv_a is None else None
        o = self._lin("attn.o_proj")
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
        rms = self.rms
        prepare = attn_kernels.mla_prepare if self.fused else attn_kernels.mla_prepare_reference
        index_prepare = attn_kernels.index_prepare if self.fused else attn_kernels.index_prepare_reference
        index_scores = attn_kernels.index_scores if self.fused else attn_kernels.index_scores_reference
        idx = None
        if spec.index_heads:
            IH, ID = spec.index_heads, spec.index_head_dim
            wq = self._lin("attn.indexer.wq_b")
            wk = self._lin("attn.indexer.wk")
            wp = self._lin("attn.indexer.weights_proj")
            # FP8 keys and a scale a key, as DeepSeek-V3.2's indexer caches them
            icache = _rand((M, self.T, ID), self.act, self.device).to(attn_kernels.INDEX_KEY_DTYPE)
            iscale = torch.full((M, self.T), 1.0 / E4M3_MAX, dtype=torch.float32, device=self.device)
            self.kv_bytes += M * T_att * (ID * icache.element_size() + iscale.element_size())
            kn_w, kn_b = self._norm_w(ID), torch.zeros(ID, dtype=_tdtype(self.act), device=self.device)
            topk = min(spec.index_topk or self.T, self.T)
            idx = (IH, ID, wq, wk, wp, icache, iscale, kn_w, kn_b, topk)
        mla = None
        select = topk_kernels.topk_indices_reference
        if self.fused:
            rows = idx[-1] if idx else self.T  # it attends to the rows the indexer keeps, where there is one
            sparse = rows < self.T
            # the pickers' inputs: zeros, and the indexer's own scores over its cache for random queries and head
            # weights, from a generator of their own (the torch path draws the same from the global one); their top
            # rows spread over the cache. Their distribution decides how soon a radix select can stop (H100, 4097
            # scores: the tail block 13.9 us on normal scores, 15.8 on the step's), so not normal scores, nor
            # integers in a scrambled order (the one-launch form 11.4 us against 14.8 on normal scores)
            kept = None
            if sparse:
                gen = torch.Generator(device=self.device).manual_seed(0)
                spread = attn_kernels.index_scores_reference(
                    torch.randn((M, IH, ID), generator=gen, device=self.device), icache,
                    torch.randn((M, IH), generator=gen, device=self.device), (IH * ID) ** -0.5, iscale)
                kept = topk_kernels.topk_indices_reference(spread, rows)
                ours = topk_kernels.forms(self.T, M, self.device)  # radix selects, pairwise rank: fastest kept
                choice = self.attn_picker.pick(("topk", M, self.T, rows), {
                    **{lab: (lambda f=f: f(spread, rows)) for lab, f in ours.items()},
                    "torch.topk (unsorted)": lambda: topk_kernels.topk_indices_reference(spread, rows)},
                    inputs_in_l2=True)  # the scores kernel has just written them
                select = ours.get(choice, select)
            try:
                splits = attn_kernels.mla_split_forms(M, H, lora, rope, rows, self.device, _tdtype(self.act))
            except DecodeGapError:  # a latent or rope width the kernel does not take: torch ops
                splits = {}
            if splits:
                qt = torch.zeros((M, H, lora + rope), dtype=_tdtype(self.act), device=self.device)
                kv_in = cache if sparse else cache[:, :rows]
                choice = self.attn_picker.pick(("mla", M, H, lora, rope, rows) + (("sparse",) if sparse else ()), {
                    **{lab: (lambda f=f: f(qt, kv_in, scale, rows=kept)) for lab, f in splits.items()},
                    "torch bmm + softmax": lambda: attn_kernels.reference_mla(
                        qt, _gather_rows(cache, kept) if sparse else kv_in, lora, scale)})
                mla = splits.get(choice)
                indexer = f"; DSA indexer: {_indexer_impl(icache.dtype == attn_kernels.INDEX_KEY_DTYPE)}" if idx else ""
                self.attention_impl = (f"MLA absorbed ({choice}; latent norm, "
                                       f"rope and cache append one kernel{indexer})")

        def proj(S):
            x = S["h"]
            if qkv_a is not None:
                q_lat, S["kv"] = qkv_a(x).split([ql, lora + rope], dim=-1)
                S["q_in"] = rms(q_lat, qa_norm, eps)
            elif q_a is not None:
                S["q_in"] = rms(q_a(x), qa_norm, eps)
            else:
                S["q_in"] = x
            S["q"] = q_b(S["q_in"]).view(M, H, nope + rope)
            if qkv_a is None:
                S["kv"] = kv_a(x)

        def attend(S):
            q_nope, q_pe = S["q"].split([nope, rope], dim=-1)
            q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [M, H, lora]
            # the latent row normed and rotated into the cache; qq = [q_lat | rope(q_pe)] [M, H, lora+rope]
            qq = prepare(q_lat, q_pe, S["kv"], cache, pos, cos, sin, kv_norm, eps)
            kv = cache
            if idx is not None:
                IH, ID, wq, wk, wp, icache, iscale, kn_w, kn_b, topk = idx
                # the key LayerNormed and rotated into its cache, the queries rotated (one kernel where fused)
                qi, qscale = index_prepare(wq(S["q_in"]).view(M, IH, ID), wk(S["h"]), icache, pos, cos, sin, kn_w,
                                           kn_b, 1e-6, iscale)
                # [M, T]: the sum over heads of w * relu(q . k), w = weights_proj(h) / sqrt(IH * ID) as the
                # reference scales it (the weights cast, and with FP8 queries scaled, as the scores kernel loads them)
                score = index_scores(qi, icache, wp(S["h"]), (IH * ID) ** -0.5, iscale, qscale)
                if topk < self.T:
                    sel = select(score, topk)
                    if mla is not None:  # the kernel reads the selected rows in place
                        S["attn_lat"] = mla(qq, cache, scale, rows=sel)
                        return
                    kv = _gather_rows(cache, sel)
            if mla is not None:
                S["attn_lat"] = mla(qq, kv, scale)
                return
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
        torch, spec, sh = self.torch, self.spec, self.shapes
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
        # up to FUSE_SHARED_MAX_BATCH rows, the shared expert as one more expert of the fused MoE, a token's (k+1)-th
        # pair, where it has the routed experts' shape (SGLang's shared-experts fusion, on by default for DeepSeek-V3
        # and GLM-5). H200, GLM-5-NVFP4 TP8 at batch 1: the step 8.70 -> 7.95 ms (the ninth pair cost nothing
        # measurable; the shared expert's own GEMVs took 0.76 ms). Before the atomic align and down's pair, its 8
        # pairs at 8 rows took the routed experts 1.1-1.7 ms a step more than the 0.96 ms the shared expert takes
        # apart (GLM-5-NVFP4 and DeepSeek-V3 fp8 at TP8); NVFP4 has since won there (the constant's figures).
        fuse_shared = bool(sh.batch <= FUSE_SHARED_MAX_BATCH.get(self.experts_kind, 0)
                           and sh.shared_inter == sh.moe_inter and spec.shared_experts == 1 and sh.ep == 1)
        self.shared_note = ("shared expert: one more expert of the fused MoE, the token's (k+1)-th pair with weight 1 "
                            "(SGLang's shared-experts fusion); its time is in routed experts") if fuse_shared else ""
        extra = 1 if fuse_shared else 0  # the shared expert's slot and pair
        shared = None
        if sh.shared_inter and not fuse_shared:
            shared = (self._lin("moe.shared.gate_up_proj"), self._lin("moe.shared.down_proj"))
        experts = Experts(E + extra, sh.moe_inter, spec.hidden, self.experts_kind, self.act, self.device,
                          self.moe_backend, top_k=k + extra)
        # only the experts a token hits are read; count those bytes (all of them are allocated)
        self.weight_bytes += experts.per_expert_bytes * (min(E, k * sh.batch) + extra)
        act = self.act_fn
        M = sh.batch

        routing = Routing(E, k, sigmoid, n_group, topk_group, norm, rscale)
        slot = E if fuse_shared else None
        fused = FusedRoute(routing, M, self.device, slot) if self.fused and fused_fits(routing) is None else None
        self.routing_impl = "triton fused" if fused is not None else "torch ops"
        # our grouped GEMVs and fused MoEs read int32 ids as the routing kernel writes them; torch's expert paths
        # index with int64 (a copy kernel a layer: 1.4 us on an H100 before the fused MoEs took int32)
        int32_ids = self.experts_kind in GROUPED_GEMV_KINDS or self.experts_kind in FUSED_K_MULTIPLE

        def route(S):
            logits = router(S["h"])
            if fused is None:
                w, ids = route_reference(logits, routing, bias)
                S["w"], S["ids"] = with_shared_slot(w, ids, slot) if fuse_shared else (w, ids)
                return
            w, ids = fused(logits, bias)
            S["w"], S["ids"] = w, ids if int32_ids else ids.long()

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
