"""torchrun worker for tests/runtime/test_expert_parallel.py: every expert-parallel case of one world size
in one launch (a launch costs 4-12 s on 2 cores). Rank 0 writes {case: {quantity: max |EP - serial|}},
each the maximum over ranks.

Layouts: a (edp, ep) DeviceMesh, ep fastest: ep ranks hold different experts and see different tokens;
edp ranks hold the same experts (expert data parallelism). World 2: (1, 2); world 4: (1, 4) and (2, 2).
Every rank also runs the serial layer or model on the concatenated global batch (it is tiny): the
reference. Rank r feeds rows [r*b, (r+1)*b) of that batch.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from autoplan.schema.moe import MoESpec
from rt_helpers import finish_worker
from runtime.models.moe import MoE, collect_aux_loss
from runtime.parallel.expert_parallel import apply_expert_parallel, reduce_gradients, update_expert_bias

H, E, FFN, ROWS, SEQ, VOCAB = 16, 8, 12, 2, 6, 64


def layer_spec(**kw) -> MoESpec:
    """The tests' MoE layer: E experts of width FFN, top-2, no renormalisation unless asked."""
    return MoESpec(**({"num_experts": E, "experts_per_token": 2, "expert_ffn_size": FFN, "normalize_top_k": False}
                      | kw))


def with_aux(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
    aux = collect_aux_loss(model)
    return loss if aux is None else loss + aux


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach() - b.detach()).abs().max().item()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class Layout:
    """This rank's place: world rank, EP mesh and coordinate, the groups."""

    def __init__(self, edp: int, ep: int) -> None:
        self.mesh = init_device_mesh("cpu", (edp, ep), mesh_dim_names=("edp", "ep"))
        self.edp, self.ep, self.rank, self.world = edp, ep, dist.get_rank(), dist.get_world_size()
        self.ep_rank = self.mesh["ep"].get_local_rank()
        self.edp_group = self.mesh["edp"].get_group()
        self.world_group = dist.group.WORLD

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch (dim 0)."""
        b = t.shape[0] // self.world
        return t[self.rank * b:(self.rank + 1) * b]

    def expert_rows(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's experts of a full [E, ...] tensor."""
        e = E // self.ep
        return t[self.ep_rank * e:(self.ep_rank + 1) * e]


def make_layer(**kw) -> MoE:
    torch.manual_seed(0)
    moe = MoE(H, layer_spec(**kw))
    moe.reset_parameters(std=0.15)  # outputs of order 0.1, as in test_moe_layer.py
    with torch.no_grad():
        moe.router.weight.normal_(0.0, 0.5)
    return moe


def layer_case(lay: Layout, mean: bool, skew: bool = False, **kw) -> dict:
    """One MoE layer, EP against serial: outputs, input gradients, every parameter gradient.

    mean=False: loss = sum over ranks of sum(out * R), expert gradients left as EP sums them
    (grad_mean=False, then summed over edp), dense gradients summed over all ranks -- the raw maths.
    mean=True: each rank's loss is its mean(out * R) + its aux loss, the serial loss their mean over ranks;
    grad_mean=True and ``reduce_gradients`` (the trainer's helper) average them."""
    serial = make_layer(**kw)
    if skew:  # every token picks experts 0 and 1 (the first EP rank's): the other ranks get no rows
        serial.router.expert_bias.copy_(torch.tensor([10.0, 10.0] + [0.0] * (E - 2)))
    par = apply_expert_parallel(copy.deepcopy(serial), lay.mesh["ep"], grad_mean=mean,
                                aux_group=lay.world_group if mean else None)
    torch.manual_seed(1)
    x = torch.randn(lay.world * ROWS, SEQ, H)
    r = torch.randn_like(x)
    serial.train(), par.train()
    xs, xp = x.clone().requires_grad_(), lay.rows(x).clone().requires_grad_()
    ys, yp = serial(xs), par(xp)
    if mean:
        loss_s = with_aux((ys * r).mean(), serial)
        loss_p = with_aux((yp * lay.rows(r)).mean(), par)
    else:
        loss_s, loss_p = (ys * r).sum(), (yp * lay.rows(r)).sum()
    loss_s.backward()
    loss_p.backward()
    if mean:
        reduce_gradients(par, lay.world_group, lay.edp_group)
        loss_p = loss_p.detach().clone()
        dist.all_reduce(loss_p)
        loss_p /= lay.world
    else:
        for name, p in par.named_parameters():
            dist.all_reduce(p.grad.to_local() if name.startswith("experts.") else p.grad,
                            group=lay.edp_group if name.startswith("experts.") else lay.world_group)
    # the serial loss is the mean of the ranks' losses: each rank's input gradient is world x the serial one
    xgrad = xp.grad / lay.world if mean else xp.grad
    out = {"out": maxdiff(yp, lay.rows(ys)), "x.grad": maxdiff(xgrad, lay.rows(xs.grad)), "loss": 0.0}
    if mean:
        out["loss"] = abs(loss_p.item() - loss_s.item())
    serial_grads = dict(serial.named_parameters())
    for name, p in par.named_parameters():
        ref = serial_grads[name].grad
        got = p.grad.to_local() if name.startswith("experts.") else p.grad
        out[f"{name}.grad"] = maxdiff(got, lay.expert_rows(ref) if name.startswith("experts.") else ref)
    if skew:
        out["rows_on_last_rank"] = float(par.tokens_per_expert[-(E // lay.ep):].sum())  # expected 0
    return out


def fsdp_case(lay: Layout) -> dict:
    """EP composed with FSDP2 as the runtime would: the experts sharded over the expert-data-parallel
    mesh (their DTensor becomes 2-D: edp x ep), everything else over the whole data-parallel mesh (the
    flattened edp x ep); FSDP2's default averaging, no hand reduction. Two forward/backward rounds on
    different batches (the second checks that FSDP2's gradient state is reset, not accumulated)."""
    from torch.distributed.fsdp import fully_shard

    serial = make_layer(num_shared_experts=1, aux_loss_coefficient=0.1)
    par = apply_expert_parallel(copy.deepcopy(serial), lay.mesh["ep"], grad_mean=True, aux_group=lay.world_group)
    fully_shard(par.experts, mesh=lay.mesh["edp"])
    fully_shard(par, mesh=lay.mesh["edp", "ep"]._flatten("dp"))
    serial.train(), par.train()
    out = {"out": 0.0, "loss": 0.0}
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(lay.world * ROWS, SEQ, H)
        r = torch.randn_like(x)
        serial.zero_grad(), par.zero_grad()  # before the forward: FSDP2 keeps the root unsharded after it
        ys, yp = serial(x), par(lay.rows(x))
        loss_s, loss_p = with_aux((ys * r).mean(), serial), with_aux((yp * lay.rows(r)).mean(), par)
        loss_s.backward()
        loss_p.backward()
        loss_p = loss_p.detach().clone()
        dist.all_reduce(loss_p)
        out["out"] = max(out["out"], maxdiff(yp, lay.rows(ys)))
        out["loss"] = max(out["loss"], abs(loss_p.item() / lay.world - loss_s.item()))
    serial_grads = dict(serial.named_parameters())
    for name, p in par.named_parameters():
        out[f"{name}.grad"] = maxdiff(p.grad.full_tensor(), serial_grads[name].grad)
    return out


class Tiny(nn.Module):
    """embedding -> x + MoE(x) -> head: the MoE is the only block."""

    def __init__(self, cfg: MoESpec) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, H)
        self.moe = MoE(H, cfg)
        self.head = nn.Linear(H, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        return self.head(h + self.moe(h))


@torch.no_grad()
def layout_free_init(model: nn.Module) -> None:
    """runtime/models/init.py's rule (each parameter drawn by name at its full shape, a shard keeps its
    part), then x8: 0.02-std weights would make the MoE's contribution ~1e-5 and the test insensitive."""
    from autoplan.schema import load_model
    from runtime.models.init import init_parameters

    init_parameters(model, load_model("gpt-tiny"), seed=0)
    for p in model.parameters():
        (p.to_local() if hasattr(p, "to_local") else p).mul_(8.0)


def train_case(lay: Layout, optimizer: str, bias_rate: float, **kw) -> dict:
    """5 steps of Tiny: serial on the global batch against EP on the rows of each rank."""
    cfg = layer_spec(**kw)
    torch.manual_seed(123)  # the two models start from different RNG states: only the init makes them equal
    serial = Tiny(cfg)
    torch.manual_seed(456)
    par = Tiny(cfg)
    apply_expert_parallel(par.moe, lay.mesh["ep"], grad_mean=True, aux_group=lay.world_group)
    layout_free_init(serial)
    layout_free_init(par)
    init_diff = max(maxdiff(full(p), q) for p, q in zip(par.parameters(), serial.parameters()))
    opts = []
    for m in (serial, par):
        opts.append(torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) if optimizer == "adamw"
                    else torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9))
    gen = torch.Generator().manual_seed(7)
    dloss = 0.0
    losses = []
    for _step in range(5):
        tokens = torch.randint(0, VOCAB, (lay.world * ROWS, SEQ + 1), generator=gen)
        step_losses = []
        for m, opt, tok in ((serial, opts[0], tokens), (par, opts[1], lay.rows(tokens))):
            loss = with_aux(F.cross_entropy(m(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten()), m)
            opt.zero_grad()
            loss.backward()
            if m is par:
                reduce_gradients(par, lay.world_group, lay.edp_group)
            opt.step()
            update_expert_bias(m, bias_rate, lay.world_group if m is par else None)
            step_losses.append(loss.detach().clone())
        dist.all_reduce(step_losses[1])
        step_losses[1] /= lay.world
        losses.append(step_losses[0].item())
        dloss = max(dloss, abs(step_losses[0].item() - step_losses[1].item()))
    dparam = max(maxdiff(full(p), q) for p, q in zip(par.parameters(), serial.parameters()))
    out = {"init": init_diff, "loss": dloss, "params_after_5": dparam,
           "loss_change": losses[0] - losses[-1]}  # > 0: it trained (reported, not a difference)
    if cfg.router == "sigmoid":
        out["expert_bias"] = maxdiff(par.moe.router.expert_bias, serial.moe.router.expert_bias)
        out["bias_moved"] = serial.moe.router.expert_bias.abs().max().item()
    return out


CASES = {
    "layer_sum_softmax_top2_shared": lambda lay: layer_case(lay, mean=False, num_shared_experts=1),
    "layer_sum_softmax_top1": lambda lay: layer_case(lay, mean=False, experts_per_token=1),
    "layer_sum_sigmoid_top2_skewed": lambda lay: layer_case(lay, mean=False, skew=True, router="sigmoid",
                                                           normalize_top_k=True),
    "layer_mean_aux_softmax_top2": lambda lay: layer_case(lay, mean=True, aux_loss_coefficient=0.1, normalize_top_k=True),
    "layer_mean_sigmoid_top1_shared": lambda lay: layer_case(lay, mean=True, experts_per_token=1, router="sigmoid",
                                                            routed_scaling_factor=2.5, num_shared_experts=2,
                                                            aux_loss_coefficient=0.05),
    "layer_mean_fsdp2_softmax_top2_shared_aux": fsdp_case,
    "train_adamw_softmax_top2_shared_aux": lambda lay: train_case(lay, "adamw", 0.0, num_shared_experts=1,
                                                                  aux_loss_coefficient=0.01),
    "train_sgd_sigmoid_top2_bias": lambda lay: train_case(lay, "sgd", 0.01, router="sigmoid", normalize_top_k=True,
                                                          routed_scaling_factor=2.5),
}



def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    layouts = [(1, world)] + ([(2, 2)] if world == 4 else [])
    results = {}
    for edp, ep in layouts:
        lay = Layout(edp, ep)
        for name, case in CASES.items():
            diffs = case(lay)
            values = torch.tensor(list(diffs.values()), dtype=torch.float64)
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
            results[f"edp{edp}_ep{ep}/{name}"] = dict(zip(diffs, values.tolist()))
    finish_worker(out_path, results)


if __name__ == "__main__":
    main(sys.argv[1])
