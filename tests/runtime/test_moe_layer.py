"""The MoE layer (runtime/models/moe.py) on one process: against a per-token reference loop written out
here, against transformers' Qwen3-MoE / Mixtral / DeepSeek-V3 blocks given the same weights, and the
load-balancing loss and bias rule on hand-checkable numbers.

Tolerances: the layer and the reference compute the same fp32 products and differ only in summation order
(the layer sums a token's k expert outputs with index_add, in expert order), a few ulps of outputs of
order 0.1 (weights drawn with std 0.15 here): 1e-6 absolute is above that (measured <= 3e-7) and far
below any routing or weighting mistake (a wrong expert or weight changes outputs by ~0.01-0.1).
Gradients (up to ~7 here) are compared to 1e-6 relative to their largest entry (measured <= 4e-7).
transformers' blocks order their sums differently again: 1e-5, as the brief asks (measured ~1e-8).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoplan.schema.moe import MoESpec
from runtime.models.moe import MoE, collect_aux_loss, load_balancing_loss
from runtime.parallel.expert_parallel import update_expert_bias

H, E, FFN = 16, 8, 12


def layer_spec(**kw) -> MoESpec:
    """The tests' MoE layer: E experts of width FFN, top-2, no renormalisation unless asked."""
    return MoESpec(**({"num_experts": E, "experts_per_token": 2, "expert_ffn_size": FFN, "normalize_top_k": False}
                      | kw))


def make_moe(seed: int = 0, **kw) -> MoE:
    torch.manual_seed(seed)
    cfg = layer_spec(**kw)
    moe = MoE(H, cfg)
    moe.reset_parameters(std=0.15)  # not the 0.02 default: outputs of order 0.1 (max ~1)
    with torch.no_grad():  # larger router weights: decisive, varied routing
        moe.router.weight.normal_(0.0, 0.5)
        if cfg.router == "sigmoid":  # a bias that changes the choice but must not enter the weights
            moe.router.expert_bias.copy_(torch.linspace(-0.2, 0.2, E))
    return moe


def swiglu(x, gate, up, down):
    return down @ (F.silu(gate @ x) * (up @ x))


def reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The layer written token by token from its definition (module docstring of runtime/models/moe.py)."""
    cfg, ex = moe.spec, moe.experts
    rows = []
    for t in x.reshape(-1, moe.hidden_size):
        logits = moe.router.weight @ t
        if cfg.router == "softmax":
            scores, choice = logits.softmax(-1), logits.softmax(-1)
        else:
            scores = logits.sigmoid()
            choice = scores + moe.router.expert_bias
        ids = sorted(range(cfg.num_experts), key=lambda e: -float(choice[e].detach()))[: cfg.experts_per_token]
        w = torch.stack([scores[e] for e in ids])
        if cfg.normalize_top_k:
            w = w / w.sum()
        w = w * cfg.routed_scaling_factor
        y = sum(w[k] * swiglu(t, ex.gate[e], ex.up[e], ex.down[e]) for k, e in enumerate(ids))
        if moe.shared is not None:
            s = moe.shared
            y = y + swiglu(t, s.gate.weight, s.up.weight, s.down.weight)
        rows.append(y)
    return torch.stack(rows).reshape(x.shape)


CASES = [  # (router, top-k, shared experts, normalize_top_k, routed_scaling_factor)
    ("softmax", 1, 0, False, 1.0), ("softmax", 2, 0, False, 1.0), ("softmax", 2, 2, True, 1.0),
    ("softmax", 1, 1, False, 1.0), ("sigmoid", 1, 0, True, 2.5), ("sigmoid", 2, 1, True, 2.5),
    ("sigmoid", 2, 0, False, 1.0), ("sigmoid", 1, 2, False, 1.0),
]


@pytest.mark.parametrize("score,k,shared,norm,scale", CASES)
def test_matches_per_token_reference(score, k, shared, norm, scale):
    moe = make_moe(router=score, experts_per_token=k, num_shared_experts=shared, normalize_top_k=norm,
                   routed_scaling_factor=scale)
    x = torch.randn(3, 7, H)
    out, ref = moe(x), reference(moe, x)
    assert out.shape == x.shape
    assert (out - ref).abs().max() <= 1e-6
    # the same gradients as the reference's autograd, for every parameter and the input
    g = torch.randn_like(x)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    params = list(moe.parameters())
    ga = torch.autograd.grad((moe(xa) * g).sum(), [xa, *params])
    gb = torch.autograd.grad((reference(moe, xb) * g).sum(), [xb, *params])
    for a, b in zip(ga, gb):  # gradients sum ~20 tokens' terms and reach ~7: relative to their size
        assert (a - b).abs().max() <= 1e-6 * max(1.0, b.abs().max().item())
    grads = dict(zip(dict(moe.named_parameters()), ga[1:]))
    if not (k == 1 and norm):  # a single renormalised weight is constant (1 * scale): no router gradient
        assert grads["router.weight"].abs().max() > 1e-3, "the router learns through the routing weights"
    for name in ("experts.gate", "experts.up", "experts.down"):
        assert grads[name].abs().max() > 1e-3


def test_unused_experts_get_zero_gradients():
    """The loop runs experts with no tokens on 0 rows: a zero gradient (not None) for their slices."""
    moe = make_moe(experts_per_token=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[3] = 1.0  # x > 0 below: every token picks expert 3
    moe(torch.rand(10, H) + 0.1).sum().backward()
    g = moe.experts.gate.grad
    assert g is not None and g[3].abs().sum() > 0
    assert g[torch.arange(E) != 3].abs().sum() == 0


def test_grouped_mm_matches_loop_on_cpu():
    """torch._grouped_mm (forced; fp32 on CPU needs rows of a multiple of 16 bytes: H, F multiples of 4)."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("no torch._grouped_mm in this torch")
    moe = make_moe(num_shared_experts=1)
    x = torch.randn(4, 9, H)
    outs, grads = [], []
    for impl in ("loop", "grouped_mm"):
        moe.experts.impl = impl
        moe.zero_grad()
        y = moe(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append(y)
        grads.append([p.grad.clone() for p in moe.parameters()])
    assert (outs[0] - outs[1]).abs().max() <= 1e-6
    for a, b in zip(*grads):
        assert (a - b).abs().max() <= 1e-6


def test_aux_loss_hand_example():
    """Two experts, top-1, four tokens: picks 0, 0, 1, 0, so f = (3/4, 1/4); P = mean probs = (0.65, 0.35);
    loss = E * sum f P = 2 * (0.75 * 0.65 + 0.25 * 0.35) = 1.15."""
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    counts = torch.tensor([3, 1])
    assert load_balancing_loss(probs, counts, top_k=1).item() == pytest.approx(1.15, abs=1e-7)
    # uniform routing and probabilities: 1, whatever E and K
    uniform = torch.full((8, 4), 0.25)
    assert load_balancing_loss(uniform, torch.tensor([4, 4, 4, 4]), top_k=2).item() == pytest.approx(1.0)


def test_aux_loss_of_the_layer():
    """MoE.aux_loss = coeff * the formula on the router's softmax; K times smaller than HF's
    load_balancing_loss_func (which divides the counts by T, not T * K); not computed in eval."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    moe = make_moe(aux_loss_coefficient=0.01)
    x = torch.randn(5, 6, H)
    moe.train()
    moe(x)
    logits = x.reshape(-1, H) @ moe.router.weight.T
    probs = logits.softmax(-1)
    ids = probs.topk(2, -1).indices
    f = torch.stack([(ids == e).sum() for e in range(E)]).float() / (ids.numel())
    expected = 0.01 * E * (f * probs.mean(0)).sum()
    assert (moe.aux_loss - expected).abs() <= 1e-7
    assert (collect_aux_loss(moe) - expected).abs() <= 1e-7
    hf = load_balancing_loss_func((logits,), num_experts=E, top_k=2)
    assert (moe.aux_loss / 0.01 * 2 - hf).abs() <= 1e-6
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0
    moe.eval()
    moe(x)
    assert moe.aux_loss is None and collect_aux_loss(moe) is None


def test_expert_bias_update_rule():
    """Loads counted in training forwards; bias += rate * sign(mean - load); counters reset; the bias moves
    the choice, never the weights (checked by the reference above)."""
    moe = make_moe(router="sigmoid", experts_per_token=2)
    moe.router.expert_bias.zero_()
    moe.train()
    x = torch.randn(40, H)
    moe(x)
    load = moe.tokens_per_expert.clone()
    assert load.sum() == 40 * 2
    update_expert_bias(moe, rate=0.001)
    assert torch.equal(moe.router.expert_bias, 0.001 * torch.sign(load.mean() - load))
    assert moe.tokens_per_expert.sum() == 0
    moe.eval()
    moe(x)
    assert moe.tokens_per_expert.sum() == 0, "eval forwards do not count"


def copy_experts_to_hf(moe: MoE, hf_experts) -> None:
    with torch.no_grad():
        hf_experts.gate_up_proj.copy_(torch.cat([moe.experts.gate, moe.experts.up], dim=1))  # [E, 2F, H]
        hf_experts.down_proj.copy_(moe.experts.down)


@pytest.mark.parametrize("norm", [False, True])
def test_matches_transformers_qwen3_moe(norm):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    moe = make_moe(normalize_top_k=norm)
    hf = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=2,
                                               moe_intermediate_size=FFN, norm_topk_prob=norm))
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.weight)
    copy_experts_to_hf(moe, hf.experts)
    x = torch.randn(2, 11, H)
    assert (moe(x) - hf(x)).abs().max() <= 1e-5


def test_matches_transformers_mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    moe = make_moe(normalize_top_k=True)  # Mixtral always renormalises its top-2
    hf = MixtralSparseMoeBlock(MixtralConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=2,
                                             intermediate_size=FFN)).eval()
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.weight)
    copy_experts_to_hf(moe, hf.experts)
    x = torch.randn(2, 11, H)
    assert (moe(x) - hf(x)).abs().max() <= 1e-5


def test_matches_transformers_deepseek_v3():
    """Sigmoid router with a correction bias, scaling factor 2.5, one shared expert (group-limited routing
    off: n_group = topk_group = 1)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    moe = make_moe(router="sigmoid", normalize_top_k=True, routed_scaling_factor=2.5, num_shared_experts=1)
    hf = DeepseekV3MoE(DeepseekV3Config(hidden_size=H, n_routed_experts=E, num_experts_per_tok=2,
                                        moe_intermediate_size=FFN, n_shared_experts=1, n_group=1, topk_group=1,
                                        routed_scaling_factor=2.5, norm_topk_prob=True))
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.weight)
        hf.gate.e_score_correction_bias.copy_(moe.router.expert_bias)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            getattr(hf.shared_experts, theirs).weight.copy_(getattr(moe.shared, ours).weight)
    copy_experts_to_hf(moe, hf.experts)
    x = torch.randn(2, 11, H)
    assert (moe(x) - hf(x)).abs().max() <= 1e-5


@pytest.mark.parametrize("field,value", [("capacity_factor", 1.25), ("router_bias", True), ("expert_bias", True),
                                         ("shared_expert_gate", True), ("router_groups", 2)])
def test_refuses_what_it_does_not_compute(field, value):
    """A spec may describe GPT-OSS or a capacity factor for the planner; the runtime's layer says it cannot
    run it rather than silently computing another layer."""
    with pytest.raises(ValueError, match=f"moe.{field}"):
        MoE(H, layer_spec(num_shared_experts=1, **{field: value}))
