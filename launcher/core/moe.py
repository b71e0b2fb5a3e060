"""Mixture-of-experts block of the training core, as torchtitan builds it (0.3: `models/common/moe.py`,
`token_dispatcher.py`): a router (gate GEMM, softmax or sigmoid scores in fp32, top-k chosen with a per-expert
bias, the chosen scores normalised), routed experts as one grouped-weight module (w1, w3: [E, F, h]; w2: [E, h, F])
and optional shared experts; dropless. Load balancing is torchtitan's auxiliary-loss-free bias (the trainer updates
`expert_bias` from `tokens_per_expert` before each optimizer step) and, when `aux_loss_coef` > 0, a Switch-style
load-balancing loss whose gradient is added where the layer runs (so it works on any pipeline stage).

Expert parallelism (ep > 1): the expert weights are DTensors sharded on dim 0 over the ep group, so a rank holds
experts / ep of them; each forward exchanges the per-expert token counts, then one all-to-all dispatches the routed
rows to the ranks owning their experts and a second combines the results (their backward is the reverse
all-to-all). `force_balance` routes round-robin (torchtitan's debug.moe_force_load_balance); the memory trace uses
it, because fake tensors carry no routing decisions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from meshplan.estimator.model_spec import ModelSpec


def local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (its own shard, differentiable), or `t` itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class GroupedExperts(nn.Module):
    """The routed experts' gated MLPs, weights stacked on a leading expert dimension (torchtitan's layout).
    `grad_scale` rescales their gradients (expert parallelism: see `apply_ep`)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        m = spec.moe
        self.geglu = spec.mlp == "geglu"
        self.grad_scale = 1.0
        self.w1 = nn.Parameter(torch.empty(m.experts, m.expert_ffn_hidden, spec.hidden))
        self.w2 = nn.Parameter(torch.empty(m.experts, spec.hidden, m.expert_ffn_hidden))
        self.w3 = nn.Parameter(torch.empty(m.experts, m.expert_ffn_hidden, spec.hidden))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows of `x` grouped by expert (`counts[e]` rows for the e-th local expert) through their experts."""
        w1, w2, w3 = local(self.w1), local(self.w2), local(self.w3)
        if self.grad_scale != 1.0:
            w1, w2, w3 = (ScaleGrad.apply(w, self.grad_scale) for w in (w1, w2, w3))
        if x.is_cuda and hasattr(torch, "_grouped_mm"):  # torchtitan's path: one grouped GEMM per matrix, bf16
            offs = torch.cumsum(torch.tensor(counts, device=x.device), 0, dtype=torch.int32)
            xb = x.bfloat16()
            a = torch._grouped_mm(xb, w1.bfloat16().transpose(-2, -1), offs=offs)
            g = F.gelu(a, approximate="tanh") if self.geglu else F.silu(a)
            h = g * torch._grouped_mm(xb, w3.bfloat16().transpose(-2, -1), offs=offs)
            return torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offs).type_as(x)
        # CPU: each expert's GEMMs as batched matmuls of one, which op-level SAC neither counts nor keeps (the GPU's
        # grouped GEMM is not on its save list either), so the memory trace sees what the GPU run keeps
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start : start + n].unsqueeze(0)
            a = torch.bmm(xe, w1[e].transpose(0, 1).unsqueeze(0))
            g = F.gelu(a, approximate="tanh") if self.geglu else F.silu(a)
            h = g * torch.bmm(xe, w3[e].transpose(0, 1).unsqueeze(0))
            outs.append(torch.bmm(h, w2[e].transpose(0, 1).unsqueeze(0)).squeeze(0))
            start += n
        return torch.cat(outs) if outs else x[:0]


class SharedExperts(nn.Module):
    """The always-on shared expert(s): one gated MLP of their summed width."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        width = spec.moe.shared_ffn_hidden
        self.geglu = spec.mlp == "geglu"
        self.w1 = nn.Linear(spec.hidden, width, bias=False)
        self.w2 = nn.Linear(width, spec.hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        g = F.gelu(a, approximate="tanh") if self.geglu else F.silu(a)
        return self.w2(g * self.w3(x))


class AllReduceGrad(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over `group` (a replicated input feeding TP-sharded
    weights gets a partial gradient on each rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AddAuxLoss(torch.autograd.Function):
    """Identity on `x` whose backward also sends a gradient of 1 into `aux` (the load-balancing loss), so the loss
    trains the router wherever the layer runs, without changing the logged loss."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape = aux.shape
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones(ctx.aux_shape, dtype=torch.float32, device=grad.device)


def balanced_counts(tokens: int, top_k: int, experts: int) -> list[int]:
    """Rows per expert when `tokens` x `top_k` assignments go round-robin over `experts`."""
    total = tokens * top_k
    return [total // experts + (1 if e < total % experts else 0) for e in range(experts)]


class MoE(nn.Module):
    """Router + routed experts (+ shared experts); `ep_group` / `ep_size` are set by expert parallelism."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        m = spec.moe
        self.num_experts, self.top_k, self.score_func = m.experts, m.top_k, m.score_func
        # node-limited routing (torchtitan's num_expert_groups / num_limited_groups); 1 group: none
        self.expert_groups, self.limited_groups = m.expert_groups, m.limited_groups or m.expert_groups
        self.router = nn.Linear(spec.hidden, m.experts, bias=False)
        self.experts = GroupedExperts(spec)
        self.shared_experts = SharedExperts(spec) if m.shared_ffn_hidden else None
        # fp32 under bf16 training too (torchtitan's expert_bias / tokens_per_expert are fp32 buffers)
        self.register_buffer("expert_bias", torch.zeros(m.experts, dtype=torch.float32), persistent=True)
        self.register_buffer("tokens_per_expert", torch.zeros(m.experts, dtype=torch.float32), persistent=False)
        self.ep_group: Any = None
        self.tp_group: Any = None  # set when TP shards the routed experts (no EP)
        self.ep_size = 1
        self.ep_rank = 0
        self.force_balance = False
        self.aux_loss_coef = 0.0

    # --- routing ---------------------------------------------------------------------------------------------
    def route(self, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(expert ids (T, k), their normalised scores (T, k) fp32, all scores (T, E) fp32)."""
        scores = self.router(xt).float()
        scores = torch.sigmoid(scores) if self.score_func == "sigmoid" else F.softmax(scores, dim=-1)
        T = xt.shape[0]
        if self.force_balance:
            ids = torch.arange(T * self.top_k, device=xt.device).view(T, self.top_k) % self.num_experts
        else:
            with torch.no_grad():
                ids = torch.topk(self.limit_groups(scores + self.expert_bias), self.top_k, dim=-1).indices
        top = scores.gather(1, ids)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, top, scores

    def limit_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Node-limited routing as torchtitan's router does it: the experts' choice scores (T, E) with every expert
        outside the token's `limited_groups` best groups (a group's score: the sum of its two best experts') at
        -inf; unchanged where the model routes anywhere."""
        if self.limited_groups >= self.expert_groups:
            return choice
        grouped = choice.unflatten(-1, (self.expert_groups, self.num_experts // self.expert_groups))
        best = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(best, dtype=torch.bool).scatter_(
            -1, best.topk(self.limited_groups, dim=-1).indices, True)
        return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        T = xt.shape[0]
        ids, top, scores = self.route(xt)
        flat = ids.reshape(-1)
        counts = torch.zeros(self.num_experts, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.float32))
        if self.training and torch._C._current_graph_task_id() == -1:  # not again in a checkpoint's recompute
            self.tokens_per_expert.add_(counts.detach())
        perm = torch.argsort(flat, stable=True)
        tok = perm // self.top_k
        rows = self.dispatch_and_compute(xt[tok], counts, T)
        if self.tp_group is not None:  # TP-sharded experts: their rows are partial sums, so the scores' gradient is
            top = AllReduceGrad.apply(top, self.tp_group)
        weighted = (rows.float() * top.reshape(-1)[perm].unsqueeze(1)).to(x.dtype)
        out = torch.zeros_like(xt).index_add(0, tok, weighted)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).reshape(-1, shape[-1])
        if self.aux_loss_coef > 0 and self.training:
            # Switch: E * sum_e (share of routed rows to e) * (mean routing probability of e)
            probs = scores / scores.sum(dim=-1, keepdim=True)
            aux = self.num_experts * (counts.detach() / (T * self.top_k) * probs.mean(dim=0)).sum()
            out = _AddAuxLoss.apply(out, self.aux_loss_coef * aux)
        return out.view(shape)

    # --- experts, locally or across the ep group ------------------------------------------------------------
    def _counts(self, counts: torch.Tensor, tokens: int) -> list[int]:
        if self.force_balance:  # known without reading the tensor (fake tensors in the memory trace)
            return balanced_counts(tokens, self.top_k, self.num_experts)
        return [int(c) for c in counts.tolist()]

    def dispatch_and_compute(self, routed: torch.Tensor, counts: torch.Tensor, tokens: int) -> torch.Tensor:
        """The routed rows (sorted by expert) through their experts, on this rank or across the ep group."""
        if self.ep_group is None:
            if self.tp_group is not None:
                routed = AllReduceGrad.apply(routed, self.tp_group)
            return self.experts(routed, self._counts(counts, tokens))
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, e_local = self.ep_size, self.num_experts // self.ep_size
        sent = self._counts(counts, tokens)
        if self.force_balance:  # every rank routes the same round-robin counts
            recv = [[sent[self.ep_rank * e_local + e] for e in range(e_local)] for _ in range(ep)]
        else:
            from torch.distributed._functional_collectives import all_to_all_single, wait_tensor

            # functional collective: op-level SAC saves its output, so a recompute does not exchange again
            got = wait_tensor(all_to_all_single(counts, None, None, self.ep_group))
            flat = [int(c) for c in got.tolist()]
            recv = [flat[r * e_local : (r + 1) * e_local] for r in range(ep)]
        in_splits = [sum(sent[r * e_local : (r + 1) * e_local]) for r in range(ep)]
        out_splits = [sum(r) for r in recv]
        x = all_to_all_single_autograd(routed, out_splits, in_splits, self.ep_group)
        # rows arrive source-rank-major (each source's rows for expert 0, 1, ...): reorder expert-major
        starts, offset = [[0] * e_local for _ in range(ep)], 0
        for r in range(ep):
            for e in range(e_local):
                starts[r][e] = offset
                offset += recv[r][e]
        order = [i for e in range(e_local) for r in range(ep) for i in range(starts[r][e], starts[r][e] + recv[r][e])]
        idx = torch.tensor(order, dtype=torch.long, device=routed.device)
        y = self.experts(x[idx], [sum(recv[r][e] for r in range(ep)) for e in range(e_local)])
        back = torch.zeros_like(y).index_copy(0, idx, y)
        return all_to_all_single_autograd(back, in_splits, out_splits, self.ep_group)


def moe_modules(parts: list[nn.Module]) -> list[MoE]:
    return [m for part in parts for m in part.modules() if isinstance(m, MoE)]


@torch.no_grad()
def update_expert_bias(parts: list[nn.Module], coeff: float, group: Any) -> None:
    """torchtitan's auxiliary-loss-free load balancing, before each optimizer step: sum every MoE layer's routed
    rows over `group` (the ranks that saw other tokens: data, context and tensor parallel ranks of this stage),
    nudge each expert's routing bias by `coeff` towards the mean load, and reset the counts."""
    mods = moe_modules(parts)
    if not mods:
        return
    counts = torch.stack([m.tokens_per_expert for m in mods])
    if group is not None:
        dist.all_reduce(counts, group=group)
    if coeff > 0:
        delta = coeff * torch.sign(counts.mean(dim=1, keepdim=True) - counts)
        delta = delta - delta.mean(dim=1, keepdim=True)
        for m, d in zip(mods, delta, strict=True):
            m.expert_bias.add_(d)
    for m in mods:
        m.tokens_per_expert.zero_()
