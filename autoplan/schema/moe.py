"""Mixture-of-Experts feed-forward layers and multi-head latent attention, as a model description holds them.

A routed MoE layer replaces the dense MLP of a block: a router (a [E, H] matrix) scores each token
against E experts, the token goes to its top-k experts, each a gated (SwiGLU) MLP of width
``expert_ffn_size``, and their outputs are summed with the router's weights; ``num_shared_experts``
experts see every token (DeepSeek-V2/V3, Qwen2-MoE), held as one dense SwiGLU MLP of that many times the
expert width (``shared_expert_ffn_size`` when a model gives it separately, as Qwen2-MoE does). The first
``first_dense_layers`` blocks keep a dense MLP of the model's ``ffn_hidden_size`` (DeepSeek-V3: 3), and
past them every ``layer_frequency``-th block is an MoE block (Qwen2-MoE's ``decoder_sparse_step``).
Group-limited routing (DeepSeek-V2/V3: ``router_groups``, ``router_group_topk``) draws a token's top-k among the
experts of its best groups; it changes no shape, but a node-deduplicating dispatcher's cost reads it.

Multi-head latent attention (DeepSeek-V2/V3, ``MLASpec``) replaces the q/k/v projections by low-rank
ones: q = W_qb norm(W_qa x) (or W_q x without ``q_lora_rank``), [k_nope, v] = W_kvb norm(W_kva x) with a
shared RoPE key of ``qk_rope_head_dim`` channels from the same down-projection.

Only shapes and counts here (torch-free): the planner prices and counts from them; the runtime's MoE
layer is runtime/models/moe.py. Counts are checked against the published totals (Mixtral-8x7B 46.7B with
12.9B active, DeepSeek-V3 671B with 37B active, ...) in tests/planner/test_moe_spec.py; a ModelSpec holds them
as ``moe`` and ``mla`` (schema/model.py: total_params, active_params) and the shipped MoE models and the Hugging
Face MoE families are checked in tests/planner/test_moe_models.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_range

Router = Literal["softmax", "sigmoid"]


@dataclass(frozen=True)
class MoESpec:
    """The routed feed-forward layers of a model (the model's ``ffn_hidden_size`` stays the dense width)."""

    num_experts: int
    experts_per_token: int
    """Top-k: how many routed experts each token goes to."""
    expert_ffn_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_size: int | None = None
    """Width of the shared MLP; None means num_shared_experts * expert_ffn_size."""
    first_dense_layers: int = 0
    layer_frequency: int = 1
    """Past the leading dense layers, block i is an MoE block when (i - first_dense_layers) % layer_frequency
    == layer_frequency - 1 (1: every block)."""
    router: Router = "softmax"
    """softmax: softmax over all experts, then top-k (Mixtral, Qwen); sigmoid: sigmoid scores, top-k on score +
    a per-expert bias balanced without a loss (DeepSeek-V3)."""
    normalize_top_k: bool = True
    """Renormalise the chosen experts' weights to sum to 1 (Mixtral, Qwen3-MoE, DeepSeek-V3)."""
    routed_scaling_factor: float = 1.0
    """DeepSeek-V3 multiplies the routed experts' combined output by 2.5."""
    capacity_factor: float | None = None
    """None: dropless (every routed token is computed); else each expert takes at most capacity_factor x its
    balanced share of tokens and drops the rest (GShard / Switch)."""
    aux_loss_coefficient: float = 0.0
    """Weight of the load-balancing loss (Switch: num_experts * sum_e f_e P_e); 0 without one."""
    shared_expert_gate: bool = False
    """Qwen2-MoE gates the shared expert's output by sigmoid(w . x), a [1, H] matrix."""
    router_bias: bool = False
    """GPT-OSS: a bias on the router."""
    expert_bias: bool = False
    """GPT-OSS: biases on the experts' projections."""
    router_groups: int = 1
    """Group-limited routing (DeepSeek-V2/V3's ``n_group``, Megatron-Core's ``moe_router_num_groups``): the
    experts fall in this many equal groups, and a token's top-k is drawn among the experts of its
    ``router_group_topk`` best groups. It changes which experts a token reaches, and so its cost under a
    node-deduplicating dispatcher when a group is the experts of one node: a token crosses the network to at
    most ``router_group_topk`` nodes (DeepSeek-V3 sec. 2.1.2 / 3.2.2, cost/comm.py ``routed_copies``). 1: no
    groups (every expert open to every token)."""
    router_group_topk: int = 1
    """The groups a token's experts come from (``topk_group``, ``moe_router_group_topk``; DeepSeek-V3: 4 of 8)."""

    def defaults_omitted(self) -> dict[str, int]:
        """The routing groups are left out of files while unused, so model files, plans and fingerprints written
        before the fields existed stay byte-identical (schema/_io.py ``to_dict``)."""
        return {"router_groups": 1, "router_group_topk": 1}

    @property
    def group_limited(self) -> bool:
        """Whether the groups restrict a token's experts (fewer chosen groups than groups)."""
        return self.router_group_topk < self.router_groups

    def validate(self) -> None:
        require_range(self, "num_experts", 1, 2**16)
        require_range(self, "experts_per_token", 1, self.num_experts)
        require_range(self, "expert_ffn_size", 1, 2**20)
        require_range(self, "num_shared_experts", 0, 2**10)
        if self.shared_expert_ffn_size is not None:
            require_range(self, "shared_expert_ffn_size", 1, 2**20)
            require(self.num_shared_experts > 0, "shared_expert_ffn_size", "needs num_shared_experts >= 1")
        require_range(self, "first_dense_layers", 0, 2**16)
        require_range(self, "layer_frequency", 1, 2**10)
        require(self.router in ("softmax", "sigmoid"), "router", f"{self.router!r} is not softmax or sigmoid")
        require(self.routed_scaling_factor > 0, "routed_scaling_factor", "must be > 0 (1.0 means no scaling)")
        if self.capacity_factor is not None:
            require(0 < self.capacity_factor <= 64, "capacity_factor",
                    f"{self.capacity_factor} must be in (0, 64], or null for dropless routing")
        require(0 <= self.aux_loss_coefficient < 1, "aux_loss_coefficient", "must be in [0, 1) (0.001-0.01 usually)")
        require_range(self, "router_groups", 1, self.num_experts)
        require(self.num_experts % self.router_groups == 0, "router_groups",
                f"{self.router_groups} does not divide the {self.num_experts} experts into equal groups")
        require_range(self, "router_group_topk", 1, self.router_groups)
        open_experts = self.router_group_topk * self.num_experts // self.router_groups
        require(self.experts_per_token <= open_experts, "router_group_topk",
                f"{self.router_group_topk} of {self.router_groups} groups open {open_experts} experts, fewer than "
                f"experts_per_token={self.experts_per_token}")

    @property
    def shared_width(self) -> int:
        """Width of the shared-expert MLP (0 without shared experts)."""
        if self.num_shared_experts == 0:
            return 0
        return self.shared_expert_ffn_size or self.num_shared_experts * self.expert_ffn_size

    def is_moe_layer(self, layer: int) -> bool:
        if layer < self.first_dense_layers:
            return False
        return (layer - self.first_dense_layers) % self.layer_frequency == self.layer_frequency - 1

    def num_moe_layers(self, num_layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(num_layers))

    def expert_params(self, hidden_size: int) -> int:
        """One routed expert: gate, up and down (and their biases with ``expert_bias``)."""
        f = self.expert_ffn_size
        return 3 * hidden_size * f + ((2 * f + hidden_size) if self.expert_bias else 0)

    def router_params(self, hidden_size: int) -> int:
        return self.num_experts * hidden_size + (self.num_experts if self.router_bias else 0)

    def shared_params(self, hidden_size: int) -> int:
        return 3 * hidden_size * self.shared_width + (hidden_size if self.shared_expert_gate else 0)

    def layer_mlp_params(self, hidden_size: int) -> int:
        """The feed-forward part of one MoE block: router, every routed expert, the shared experts."""
        return (self.router_params(hidden_size) + self.num_experts * self.expert_params(hidden_size)
                + self.shared_params(hidden_size))

    def active_mlp_params(self, hidden_size: int) -> int:
        """Parameters one token's forward uses in the feed-forward part: router, k experts, shared ones."""
        return (self.router_params(hidden_size) + self.experts_per_token * self.expert_params(hidden_size)
                + self.shared_params(hidden_size))


@dataclass(frozen=True)
class YarnRope:
    """DeepSeek-V3's YaRN RoPE extension (Hugging Face's ``rope_type: yarn``; Peng et al. 2023): RoPE
    frequencies interpolated by ``factor`` below the ``beta_slow``/``beta_fast`` band, and MLA's softmax scale
    multiplied by mscale(factor, mscale_all_dim)^2 (``yarn_apply_mscale``). Shapes and counts do not depend
    on it; it is kept so that the spec says what the published model computes."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    """With both given, the RoPE attention factor is mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    (1 in DeepSeek-V3, where both are 1.0); None as in Hugging Face (the factor is 0.1 ln(factor) + 1)."""

    def validate(self) -> None:
        require(1.0 <= self.factor <= 1e6, "factor", f"{self.factor} must be in [1, 1e6] (40 in DeepSeek-V3)")
        require_range(self, "original_max_position_embeddings", 1, 2**24)
        require(0 < self.beta_slow <= self.beta_fast <= 1e6, "beta_slow",
                f"{self.beta_slow} must be positive and at most beta_fast={self.beta_fast} (1 and 32 usually)")
        for name in ("mscale", "mscale_all_dim"):
            require_range(self, name, 0.0, 1e3)


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek's multi-head latent attention: low-rank query and key/value projections."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    """None: queries by one full-rank projection (DeepSeek-V2-Lite)."""
    rope_scaling: YarnRope | None = None
    """DeepSeek-V3's YaRN context extension of the shared RoPE key and query channels; None: plain RoPE."""

    def validate(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            require_range(self, name, 1, 2**16)
        if self.q_lora_rank is not None:
            require_range(self, "q_lora_rank", 1, 2**16)
        if self.rope_scaling is not None:
            try:
                self.rope_scaling.validate()
            except ValueError as err:
                raise type(err)(f"rope_scaling.{err}") from None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params(self, hidden_size: int, heads: int) -> int:
        """q (down, norm, up or one projection), kv down (with the shared RoPE key), its norm, kv up, output."""
        h, q_width = hidden_size, heads * self.qk_head_dim
        if self.q_lora_rank is None:
            q = h * q_width
        else:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_width
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + heads * self.v_head_dim * h
