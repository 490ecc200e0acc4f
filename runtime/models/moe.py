"""Mixture-of-Experts feed-forward layer (token-choice top-k routing, dropless), the sparse counterpart of
Llama's SwiGLU ``MLP``.

A router scores every token against E experts and sends it to its top k; each expert is a SwiGLU
``down(silu(gate(x)) * up(x))`` of width F; the token's output is the weighted sum of its k expert
outputs, plus optional shared experts every token passes through (DeepSeek-V3 / Qwen2-MoE).

Naming (shape suffixes in comments): T tokens, H hidden size, E experts, e experts held by this rank
(E / ep), F expert FFN width, K experts per token, N = T*K routed (token, slot) pairs, R routed pairs
this rank computes (under expert parallelism, the pairs sent to its experts by every EP rank).

The layer's description is the model spec's ``MoESpec`` (autoplan/schema/moe.py); the fields it cannot
compute (a capacity factor, GPT-OSS's router and expert biases, Qwen2-MoE's shared-expert gate) are
refused by ``check_runnable``.

Routers (``MoESpec.router``):
* "softmax" (Mixtral, Qwen-MoE): p = softmax(logits) over all E; top k of p; weights = those p,
  renormalised to sum 1 if ``normalize_top_k`` (Mixtral always, Qwen3-MoE per config).
* "sigmoid" (DeepSeek-V3): s = sigmoid(logits); top k chosen on s + ``expert_bias`` (a buffer moved by
  the aux-loss-free balancing rule, runtime/parallel/expert_parallel.py ``update_expert_bias``, never
  by gradient); weights = the chosen s (without the bias), normalised if ``normalize_top_k``.
Both then multiply by ``routed_scaling_factor``. The router runs in fp32 (torchtitan, HF): softmax over
many experts in bf16 shifts which experts win.

Dropless: every expert computes every token routed to it, whatever the imbalance, so the compute and the
all-to-all volume per rank vary from step to step. A capacity factor (drop tokens past C * N / E per
expert, Switch / GShard) is not implemented yet.

Load balancing: the Switch/Mixtral auxiliary loss (``aux_loss_coefficient`` > 0; see ``load_balancing_loss``)
is computed in training forwards and either left on ``MoE.aux_loss`` for a caller to add to its loss
(``collect_aux_loss``: the standalone tests), or, when ``MoE.aux_loss_grad_scale`` is set (the runtime's
models), attached to the layer's output by ``AuxLossAutoScaler`` so that backward through the output also
backpropagates the auxiliary loss -- under pipeline parallelism only the last stage's loss is backpropagated,
and an earlier stage's MoE layers would otherwise lose theirs. The sigmoid router's bias rule is
``update_expert_bias``.

Expert compute: ``torch._grouped_mm`` (one kernel for all experts, as torchtitan) where it is known to
run -- CUDA, bf16, Hopper or newer, aligned sizes -- otherwise a loop over the experts, each on the
contiguous slice of tokens routed to it. The loop is exact and runs anywhere; it is the CPU path.
torch 2.13's CPU ``_grouped_mm`` works for fp32 with sizes whose rows are multiples of 16 bytes, and
``impl="grouped_mm"`` forces it (the tests check it against the loop), but it is not faster on CPU.

Parameters (names the layout-free init of runtime/models/init.py seeds by): ``router.weight`` [E, H],
``experts.gate`` / ``experts.up`` [E, F, H], ``experts.down`` [E, H, F] (3-D, grouped layout: expert
parallelism shards dim 0), ``shared.gate/up/down.weight`` (nn.Linear, no bias), width
``MoESpec.shared_width``. Buffers: ``router.expert_bias`` [E] (sigmoid only, persistent: it is
training state) and ``tokens_per_expert`` [E] (the load counted since the last bias update).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoplan.errors import SpecError
from autoplan.schema.moe import MoESpec


def check_runnable(spec: MoESpec) -> None:
    """Refuse what this layer does not compute (a model description may still plan it)."""
    for field, why in (("capacity_factor", "routing is dropless"), ("router_bias", "the router has no bias"),
                       ("expert_bias", "the experts have no biases"),
                       ("shared_expert_gate", "the shared experts are not gated")):
        value = getattr(spec, field)
        if value not in (None, False):
            raise ValueError(f"moe.{field}: {value!r} is not supported by the runtime's MoE layer ({why})")
    if spec.group_limited:
        raise ValueError(f"moe.router_groups: {spec.router_groups} (top {spec.router_group_topk}) is not supported by "
                         "the runtime's MoE layer (its top-k runs over every expert)")


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor parameter, differentiably (``to_local``), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class AuxLossAutoScaler(torch.autograd.Function):
    """Identity on the layer's output; in backward, also gives the auxiliary loss the gradient ``scale``, as
    if ``scale * aux_loss`` had been added to the loss being backpropagated. Megatron-Core's
    ``MoEAuxLossAutoScaler`` (megatron/core/transformer/moe/moe_utils.py), whose scale is the main loss's
    backward scale (loss scale / micro-batches); the runtime sets ours per step (``set_aux_loss_grad_scale``)."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux_loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        ctx.scale = scale
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.full_like(aux_loss, ctx.scale), None


class Router(nn.Module):
    """Token-choice top-k router: which K experts each token goes to, and with which weights."""

    def __init__(self, hidden_size: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden_size))
        if spec.router == "sigmoid":
            self.register_buffer("expert_bias", torch.zeros(spec.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, K] fp32, expert ids [T, K] int64, balance probabilities [T, E] fp32).

        The balance probabilities feed the auxiliary loss: softmax probabilities, or for sigmoid the scores
        normalised per token (DeepSeek-V3's sequence-wise balance loss does the same)."""
        spec = self.spec
        logits = F.linear(x.float(), router_weight(self.weight).float())  # [T, E]
        if spec.router == "softmax":
            scores = logits.softmax(dim=-1)
            ids = scores.topk(spec.experts_per_token, dim=-1).indices
            probs = scores
        else:
            scores = logits.sigmoid()
            ids = (scores + self.expert_bias).topk(spec.experts_per_token, dim=-1).indices  # bias: choice only
            probs = scores / scores.sum(dim=-1, keepdim=True)
        weights = scores.gather(-1, ids)  # [T, K]
        if spec.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * spec.routed_scaling_factor, ids, probs


def router_weight(w: torch.Tensor) -> torch.Tensor:
    """The router matrix as a local tensor. Under tensor parallelism with sequence parallelism the runtime
    makes it a Replicate DTensor on the TP mesh (runtime/parallel/tensor_parallel.py) while each TP rank
    routes only its own slice of the tokens: each rank's gradient is then a partial sum, so ``to_local``
    declares it ``Partial`` and DTensor / FSDP2 sum it over the TP group (as for the sequence-parallel norm
    weights; Megatron-Core all-reduces the router's gradient over TP for the same reason)."""
    from torch.distributed.tensor import DTensor, Partial

    if isinstance(w, DTensor):
        return w.to_local(grad_placements=[Partial()] * w.device_mesh.ndim)
    return w


def grouped_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``impl="auto"`` takes ``torch._grouped_mm``: the case torchtitan runs (CUDA, bf16, sm90+),
    with the row strides a multiple of 16 bytes that the kernel asserts."""
    return (hasattr(torch, "_grouped_mm") and x.is_cuda and x.dtype == w.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= (9, 0)
            and all(n * x.element_size() % 16 == 0 for n in w.shape[1:]))


class GroupedExperts(nn.Module):
    """E SwiGLU experts as three 3-D weights; computes tokens already sorted by expert.

    Under expert parallelism the weights are DTensors sharded on dim 0 (this rank's e experts), and under
    expert tensor parallelism also on the width F (gate / up by columns, down by rows: this rank's slice of
    each expert, whose output is then a partial sum the dispatcher reduces); ``forward`` only sees local
    tensors and computes the same either way. ``grad_scale`` (set by ``apply_expert_parallel``) multiplies the
    weights' gradients: see there why."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size))  # [E, F, H]
        self.up = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size))  # [E, F, H]
        self.down = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_size))  # [E, H, F]
        self.impl: Literal["auto", "loop", "grouped_mm"] = "auto"
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [R, H] sorted by local expert, counts [e] tokens per local expert -> [R, H]."""
        ws = [local(w) for w in (self.gate, self.up, self.down)]
        if self.grad_scale != 1.0:
            ws = [_ScaleGrad.apply(w, self.grad_scale) for w in ws]
        gate, up, down = ws
        if self.impl == "grouped_mm" or (self.impl == "auto" and grouped_mm_supported(x, gate)):
            offs = counts.cumsum(0, dtype=torch.int32)  # end row of each expert's group, stays on device
            h = F.silu(torch._grouped_mm(x, gate.transpose(-2, -1), offs=offs))
            h = h * torch._grouped_mm(x, up.transpose(-2, -1), offs=offs)
            return torch._grouped_mm(h, down.transpose(-2, -1), offs=offs)
        # the loop: experts with no tokens still run (on 0 rows), so every expert gets a (zero) gradient
        parts = x.split(counts.tolist())  # host sync on a GPU: the slice sizes are needed on the host
        outs = [F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e]) for e, xe in enumerate(parts)]
        return torch.cat(outs)


class SwiGLU(nn.Module):
    """The shared expert(s): a dense SwiGLU, down(silu(gate(x)) * up(x)), as Llama's MLP."""

    def __init__(self, hidden_size: int, ffn_size: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden_size, ffn_size, bias=False)
        self.up = nn.Linear(hidden_size, ffn_size, bias=False)
        self.down = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int, group: Any = None) -> torch.Tensor:
    """Switch/Mixtral load-balancing loss E * sum_e f_e * P_e (Fedus et al. 2021, eq. 4; Megatron-Core's
    ``switch_load_balancing_loss_func``).

    f_e = counts_e / (T * K): the fraction of the routed (token, slot) pairs sent to expert e (sums to 1;
    not differentiable); P_e = mean over the T tokens of probs[:, e] (carries the gradient to the router).
    Uniform routing gives 1. HF's ``load_balancing_loss_func`` divides the counts by T only, so its value is
    K times this one.

    ``group``: count f over these ranks' tokens too (all-reduce of E + 1 numbers), P staying local. With
    equal token counts per rank, the mean over the group of the ranks' losses then equals the loss of
    the concatenated batch (Megatron's "global" balance, Qiu et al. 2025) -- the serial reference."""
    stats = torch.cat([counts.float(), counts.new_full((1,), probs.shape[0]).float()]).detach()
    if group is not None:
        dist.all_reduce(stats, group=group)
    f = stats[:-1] / (stats[-1] * top_k)
    return probs.shape[-1] * (f * probs.mean(dim=0)).sum()


class MoE(nn.Module):
    """Router + grouped experts (+ shared experts), input and output [..., H] like Llama's ``MLP``.

    ``dispatcher``: None computes every expert here; ``apply_expert_parallel`` installs an all-to-all
    dispatcher that sends the routed tokens to the ranks holding their experts (or expert slices) and back.
    ``aux_group``: the process group the auxiliary loss counts tokens over (None: this rank's tokens).
    After a training forward, ``aux_loss`` holds aux_loss_coefficient * the balance loss (with its graph), or
    None when the coefficient is 0. ``aux_loss_grad_scale``: None leaves it there for ``collect_aux_loss``; a
    number attaches it to the output (``AuxLossAutoScaler``) with that backward scale.
    The shared experts get the input in its original shape ([B, T, H]), so that tensor parallelism can
    gather a sequence-parallel slice for them along dim 1 (runtime/parallel/tensor_parallel.py)."""

    def __init__(self, hidden_size: int, spec: MoESpec) -> None:
        super().__init__()
        check_runnable(spec)
        self.spec, self.hidden_size = spec, hidden_size
        self.router = Router(hidden_size, spec)
        self.experts = GroupedExperts(spec.num_experts, hidden_size, spec.expert_ffn_size)
        self.shared = SwiGLU(hidden_size, spec.shared_width) if spec.shared_width else None
        self.register_buffer("tokens_per_expert", torch.zeros(spec.num_experts), persistent=False)
        self.dispatcher: Any = None
        self.aux_group: Any = None
        self.aux_loss: torch.Tensor | None = None
        self.aux_loss_grad_scale: float | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """N(0, std) weights (the standalone default; a model's init_parameters overwrites them by name)."""
        for p in self.parameters():
            local(p).normal_(0.0, std)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Zero the load counter and the routing bias (after a meta build and ``to_empty``)."""
        self.tokens_per_expert.zero_()
        if hasattr(self.router, "expert_bias"):
            self.router.expert_bias.zero_()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.is_meta:  # shapes only: the routing, which sizes every expert's slice, needs values
            raise SpecError(f"the MoE layer ({self.spec.num_experts} experts) runs on real tensors only: the "
                            "routed token counts decide its shapes, which a meta-device trace (autoplan profile) "
                            "cannot know; profile MoE models: not yet (issue 31)")
        shape = inputs.shape
        x = inputs.reshape(-1, shape[-1])  # [T, H]
        weights, ids, probs = self.router(x)  # [T, K], [T, K], [T, E]
        flat = ids.flatten()  # scatter_add, not bincount: no device-to-host sync on a GPU
        counts = torch.zeros(self.spec.num_experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))  # [E] pairs per expert
        if self.training:
            self.tokens_per_expert += counts  # recomputed forwards count twice: harmless to the sign rule
        self.aux_loss = None
        if self.training and self.spec.aux_loss_coefficient > 0:
            self.aux_loss = self.spec.aux_loss_coefficient * load_balancing_loss(
                probs, counts, self.spec.experts_per_token, self.aux_group)
        out = self.routed(x, weights, ids, counts).reshape(shape)
        if self.shared is not None:
            out = out + self.shared(inputs)
        if self.aux_loss is not None and self.aux_loss_grad_scale is not None:
            out = AuxLossAutoScaler.apply(out, self.aux_loss, self.aux_loss_grad_scale)
            self.aux_loss = self.aux_loss.detach()  # in the graph through ``out`` now; kept for reading only
        return out

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Sort the N = T*K (token, slot) pairs by expert, compute them, weight and sum them per token."""
        order = ids.flatten().argsort(stable=True)  # [N] pair indices, expert-major
        token = order // self.spec.experts_per_token  # [N] the token of each sorted pair
        xs = x[token]  # [N, H]
        if self.dispatcher is None:
            ys = self.experts(xs, counts)
        else:
            ys = self.dispatcher(xs, counts, self.experts)
        ys = (ys.float() * weights.flatten()[order, None]).to(x.dtype)  # weight in fp32 (router precision)
        return torch.zeros_like(x).index_add(0, token, ys)  # [T, H]


def moe_layers(model: nn.Module) -> list[MoE]:
    """Every MoE layer of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def set_aux_loss_grad_scale(models: list[nn.Module], scale: float | None) -> None:
    """Attach every MoE layer's auxiliary loss to its output with backward scale ``scale`` (None: detach it)."""
    for model in models:
        for m in moe_layers(model):
            m.aux_loss_grad_scale = scale


def collect_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """The sum of the MoE layers' auxiliary losses of the last forward (None if none was computed): the
    trainer adds it to the micro-batch's loss, scaled like that loss."""
    losses = [m.aux_loss for m in moe_layers(model) if m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None
