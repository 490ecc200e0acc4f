"""The Mixture-of-Experts layouts of tests/runtime/test_moe_layouts.py (moe-tiny on 4 ranks) and their serial
reference, shared by the test and its torchrun worker (moe_worker.py)."""

from __future__ import annotations

import dataclasses

from autoplan.schema import ModelSpec, Plan, check_fits, load_model
from rt_helpers import make_plan

WORLD, STEPS = 4, 5
LEARNING_RATE = 1e-3  # llama-tiny's rate in rt_cases.py: at 1e-2 AdamW's first sign-like steps amplify fp32 noise

CASES: dict[str, dict] = {
    # ep x edp = dp: 2 expert groups of 2 ranks, experts averaged over edp 2 (ZeRO 1)
    "ep2": dict(dp=4, ep=2, zero=1),
    # every rank 2 experts, no expert data parallelism (edp 1) under a replicated (ZeRO 0) dense model
    "ep4": dict(dp=4, ep=4, zero=0),
    # the EP group is a TP pair: each rank routes its sequence half; shared experts split over TP (ZeRO 2)
    "ep2_tp2": dict(tp=2, dp=2, ep=2, sp=True, zero=2),
    # pipeline: the first stage's MoE aux loss reaches the router through the activations (AuxLossAutoScaler)
    "ep2_pp2_1f1b": dict(pp=2, dp=2, ep=2, schedule="1f1b", num_microbatches=4, zero=1),
    # zero-bubble V schedule: split backwards (input, then weight), the router's aux-loss gradient in the latter
    "ep2_pp2_zbv": dict(pp=2, dp=2, ep=2, schedule="zbv", virtual_stages=2, num_microbatches=4, zero=1),
    # ZeRO-3: experts sharded over edp 2 on top of the EP split, resharded after each forward
    "ep2_zero3": dict(dp=4, ep=2, zero=3),
    # tp 4 > ep 2: no dense data parallelism (dp 1), yet each expert has 2 copies (edp 2: TP ranks 0 and 2 hold
    # experts 0-3), so the experts alone are an FSDP2 unit over edp
    "ep2_tp4": dict(tp=4, ep=2, sp=True, zero=2),
    # context parallelism: the EP group is a CP pair (two halves of each sequence, two losses averaged like
    # replicas'), ring attention between them
    "ep2_cp2": dict(cp=2, dp=2, ep=2, zero=1),
    # recomputation with the aux loss attached: blocks 1-2 in full (the dispatch and the aux loss rerun in
    # backward), block 3's attention core selectively, under TP + SP and ZeRO-3
    "ep2_tp2_recompute": dict(tp=2, dp=2, ep=2, sp=True, full=(1, 2), selective=(3,), zero=3),
    # no EP, TP 2: every rank holds all experts, each TP rank computes its own tokens (edp 4 = dp x tp)
    "ep1_tp2": dict(tp=2, dp=2, sp=True, zero=1),
    # DeepSeek-style routing: sigmoid scores, top-k on score + a bias moved after each step by the loads of the
    # whole step (aux-loss free), scaled x2.5, a shared expert (column/row-parallel over TP, input gathered)
    "sigmoid_shared_ep2_tp2": dict(model="moe-tiny-sigmoid", tp=2, dp=2, ep=2, sp=True, zero=3),
    # ... under 1F1B with both MoE blocks of stage 1 recomputed in full (a second dispatch in backward)
    "sigmoid_shared_ep2_pp2_recompute": dict(model="moe-tiny-sigmoid", pp=2, dp=2, ep=2, schedule="1f1b",
                                             num_microbatches=4, full=(2, 3), zero=0),
    # expert tensor parallelism (Megatron-Core's expert-tp): each expert's gate/up split by columns, down by
    # rows over etp; etp = tp folds the ETP group onto the TP pair, ep over the replicas (edp 1)
    "etp2_ep2_tp2": dict(tp=2, dp=2, ep=2, etp=2, sp=True, zero=1),
    # etp without ep: every rank holds all 8 experts' halves; the ETP pair all-gathers its sequence halves
    "etp2_tp2": dict(tp=2, dp=2, etp=2, sp=True, zero=2),
    # ZeRO-3 over an expert data-parallel group of one (edp 1) on top of the (ep, etp) split
    "etp2_ep2_tp2_zero3": dict(tp=2, dp=2, ep=2, etp=2, sp=True, zero=3),
    # etp over data-parallel replicas (no TP): the ETP pair gathers two replicas' rows; ZeRO-3 shards each
    # expert slice over edp 2 (FSDP2 makes the weights 2-D (edp, etp) DTensors)
    "etp2_dp4_zero3": dict(dp=4, etp=2, zero=3),
    # DeepSeek-style routing with a shared expert (split over TP) beside the etp-split routed experts
    "sigmoid_shared_etp2_ep2_tp2": dict(model="moe-tiny-sigmoid", tp=2, dp=2, ep=2, etp=2, sp=True, zero=1),
}
ETP_LAYERS: dict[str, dict] = {
    # one MoE layer (sigmoid router, grad_mean) under ``apply_expert_parallel`` on a (ep, etp) mesh against the
    # serial layer; "skew" biases every token to experts 0 and 1, so the ranks holding experts 4-7 (ep
    # coordinate 1) receive no rows and their ETP all-gather and reduce-scatter move empty tensors
    "etp_layer_ep2_etp2": dict(shape=(2, 2), axes=("ep", "etp"), skew=False),
    "etp_layer_ep2_etp2_skew": dict(shape=(2, 2), axes=("ep", "etp"), skew=True),
    "etp_layer_etp4": dict(shape=(4,), axes=("etp",), skew=False),
}
EVAL = {"eval_ep2_pp2": dict(pp=2, dp=2, ep=2, schedule="1f1b", num_microbatches=2, zero=1),
        "eval_ep2_tp2": dict(tp=2, dp=2, ep=2, sp=True, zero=3)}
"""Forward-only evaluation (runtime/evaluate.py) of the initial weights over EVAL_SEQUENCES windows of EVAL_DATA."""
EVAL_SEQUENCES = 11  # not a multiple of the global batch (8): the last batch has padding rows
RESUME_STEPS, RESUME_AT = 6, 3
RESUME: dict[str, tuple[dict, dict]] = {
    # (saved by, resumed into): the same layout; and another ep and ZeRO stage (DCP reshards the expert DTensors)
    "resume_ep2_pp2_zero3": (dict(pp=2, dp=2, ep=2, schedule="1f1b", num_microbatches=2, zero=3),) * 2,
    "resume_ep2_zero3_into_ep4_zero1": (dict(dp=4, ep=2, zero=3), dict(dp=4, ep=4, zero=1)),
    # an etp2 x ep2 ZeRO-3 checkpoint (expert weights split on dims 0 and 1/2, edp 1) into ep2 with whole
    # experts (etp 1) averaged over edp 2, ZeRO-1; the same attention side (tp2 dp2: the same global batches)
    "resume_etp2_ep2_zero3_into_ep2": (dict(tp=2, dp=2, ep=2, etp=2, sp=True, zero=3),
                                       dict(tp=2, dp=2, ep=2, sp=True, zero=1)),
}


def sigmoid_variant() -> ModelSpec:
    """moe-tiny routed as DeepSeek-V3 routes (sigmoid, bias-balanced, scaled, one shared expert), no aux loss."""
    spec = load_model("moe-tiny")
    moe = dataclasses.replace(spec.moe, router="sigmoid", routed_scaling_factor=2.5, num_shared_experts=1,
                              aux_loss_coefficient=0.0)
    return dataclasses.replace(spec, name="moe-tiny-sigmoid", moe=moe)


def moe_plan(ep: int = 1, etp: int = 1, model: str = "moe-tiny", **kw) -> Plan:
    """make_plan for moe-tiny (or its sigmoid variant) with the expert sizes set (make_plan knows no ep),
    checked like a plan file."""
    spec = sigmoid_variant() if model == "moe-tiny-sigmoid" else load_model(model)
    plan = make_plan(spec, learning_rate=LEARNING_RATE, **kw)
    plan = dataclasses.replace(plan, ep=ep, etp=etp)
    check_fits(plan.layout(), plan.model, plan.training, plan.cluster.num_devices)
    return plan


def serial_eval_sum(plan: Plan, data: str, sequences: int) -> float:
    """The summed next-token loss of the serial model (initial weights, eval mode) over the first windows."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from runtime.models import build_model
    from runtime.train.data import TokenSource

    t = plan.training
    model = build_model(plan.model, seq_len=t.seq_len, seed=t.seed).eval()
    x, y = TokenSource(plan.model.vocab_size, t.seq_len, t.seed, data).rows(np.arange(sequences))
    with torch.no_grad():
        return F.cross_entropy(model(x).flatten(0, 1).double(), y.flatten(), reduction="sum").item()


def serial_moe_run(plan: Plan, steps: int) -> dict:
    """The serial reference for an MoE plan: one process, plain PyTorch (rt_helpers' optimizer and fp64 norm).

    The auxiliary balance loss is not linear in the tokens (f_e x P_e over a batch), so its value depends on
    which tokens one forward sees: the runtime computes it per micro-batch with the expert loads counted over
    every rank of the stage, i.e. over *global micro-batch* i -- rows i*mbs .. (i+1)*mbs-1 of every data-parallel
    replica. The reference forwards exactly those rows together, one global micro-batch at a time, and
    optimises the mean over them of (LM loss + aux loss); it reports the LM loss (as the runtime does).
    Sigmoid routers move their bias after each step by the step's loads (every micro-batch), as the runtime does.
    Returns losses, grad norms (before clipping) and the expert / router norms of the clipped gradients."""
    import torch
    import torch.nn.functional as F

    from rt_helpers import reference_optimizer
    from runtime.models import build_model
    from runtime.models.moe import collect_aux_loss, moe_layers
    from runtime.parallel.expert_parallel import EXPERT_BIAS_RATE, update_expert_bias
    from runtime.train.data import TokenSource
    from runtime.train.optim import lr_at

    t = plan.training
    model = build_model(plan.model, seq_len=t.seq_len, seed=t.seed)
    data = TokenSource(plan.model.vocab_size, t.seq_len, t.seed, None)
    params = list(model.parameters())
    names = [name for name, _ in model.named_parameters()]
    opt = reference_optimizer(params, t)
    rows, n, mbs = t.global_batch_size // plan.dp, plan.num_microbatches, plan.micro_batch_size
    out: dict = {"losses": [], "grad_norms": [], "expert_norms": [], "router_norms": [], "bias_l1": []}
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        opt.zero_grad()
        x, y = data.global_batch(step, t.global_batch_size)
        lm_total = 0.0
        for i in range(n):
            idx = torch.tensor([d * rows + i * mbs + j for d in range(plan.dp) for j in range(mbs)])
            lm = F.cross_entropy(model(x[idx]).flatten(0, 1), y[idx].flatten())
            aux = collect_aux_loss(model)
            ((lm if aux is None else lm + aux) / n).backward()
            lm_total += lm.item() / n
        grads = [p.grad for p in params]
        norm = torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, t.grad_clip, norm)
        opt.step()
        update_expert_bias(model, EXPERT_BIAS_RATE)  # sigmoid routers: the step's loads (a no-op for softmax)
        out["bias_l1"].append(sum(float(m.router.expert_bias.double().abs().sum()) for m in moe_layers(model)
                                  if hasattr(m.router, "expert_bias")))
        out["losses"].append(lm_total)
        out["grad_norms"].append(norm.item())
        for key, part in (("expert_norms", ".mlp.experts."), ("router_norms", ".mlp.router.")):
            sq = sum(g.double().square().sum() for name, g in zip(names, grads) if part in name)
            out[key].append(float(sq.sqrt()))
    return out
