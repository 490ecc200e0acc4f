"""The model spec: the shape of a decoder-only transformer, as the planner and the runtime both read it.

Naming: "layer" means one transformer block; the embedding in front and the head (final norm + logits)
behind are not counted in ``num_layers``. "heads" are query heads; ``num_kv_heads`` < ``num_attention_heads``
is grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from autoplan.errors import SpecError
from autoplan.schema._io import require, require_range
from autoplan.schema.limits import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_PARAMS, MAX_SEQ_LEN, MAX_VOCAB_SIZE
from autoplan.schema.moe import MLASpec, MoESpec

Architecture = Literal["gpt", "llama"]
MEGATRON_VOCAB_DIVISOR = 128
"""Megatron-LM's default ``--make-vocab-size-divisible-by``."""
ACTIVATIONS: dict[str, tuple[str, ...]] = {"gpt": ("gelu", "gelu_tanh"), "llama": ("silu", "relu2")}
"""The MLP activations a spec of each architecture may have; the first is the default. ``gelu`` is the exact
erf form, ``gelu_tanh`` the tanh approximation (Hugging Face's ``gelu_new`` and ``gelu_pytorch_tanh``,
GPT-2's); llama's ``silu`` is SwiGLU's gate (three matrices), ``relu2`` the squared ReLU of a non-gated MLP
(two matrices; Nemotron-4, So et al. 2021), which the planner prices and the runtime's llama does not
compute (``runtime_refusal``)."""
NON_GATED = ("gelu", "gelu_tanh", "relu2")
"""Activations of a two-matrix MLP (up, then down); the others gate a third matrix."""


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency rule (Hugging Face's ``rope_type: llama3``, ``_compute_llama3_parameters``):
    wavelengths 2 pi / inv_freq shorter than ``original_max_position_embeddings / high_freq_factor`` keep
    their frequency, longer than ``original_max_position_embeddings / low_freq_factor`` are divided by
    ``factor``, and those between interpolate smoothly. The only scaling rule the runtime implements."""

    rope_type: Literal["llama3"] = "llama3"
    factor: float
    """The divisor of the low frequencies (8 in Llama 3.1)."""
    low_freq_factor: float
    """1 in Llama 3.1."""
    high_freq_factor: float
    """4 in Llama 3.1."""
    original_max_position_embeddings: int
    """The context length of pretraining in tokens (8192 in Llama 3.1)."""

    def validate(self) -> None:
        require(self.factor >= 1.0, "factor", f"{self.factor} must be at least 1 (8.0 in Llama 3.1)")
        require(0.0 < self.low_freq_factor < self.high_freq_factor, "low_freq_factor",
                f"{self.low_freq_factor} must be positive and below high_freq_factor={self.high_freq_factor} "
                "(1.0 and 4.0 in Llama 3.1)")
        require_range(self, "high_freq_factor", 0.0, 1e6, low_open=True)
        require_range(self, "original_max_position_embeddings", 1, MAX_SEQ_LEN)


@dataclass(frozen=True)
class ModelSpec:
    """A transformer the cost model has formulas for and the runtime has a reference implementation of.

    ``gpt``: LayerNorm, GELU MLP (two matrices), learned positions, biases, tied embedding by default.
    ``llama``: RMSNorm, SwiGLU MLP (three matrices), rotary positions, no biases, untied by default;
    optionally biases on q, k, v (Qwen2), per-head RMSNorm on q and k (Qwen3), a head width other than
    hidden_size / heads (Qwen3) and Llama 3.1's RoPE scaling; Mixture-of-Experts feed-forward layers
    (``moe``: Mixtral, Qwen-MoE, DeepSeek-V3), DeepSeek's multi-head latent attention (``mla``) and its
    multi-token-prediction modules (``mtp_layers``), which the cost model prices (cost/moe_ops.py) and the
    runtime builds in part (``runtime_refusal``).

    Every field added after the first release has a default meaning "as before" and is left out of the
    YAML/JSON written for a spec while it holds that default (``defaults_omitted``), so the plan files,
    fingerprints and checkpoint manifests of existing models do not change.
    """

    name: str
    architecture: Architecture
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int = 2048
    """Default training sequence length in tokens (the command line may override it)."""
    tie_embeddings: bool | None = None
    """Share the input embedding with the output projection; None means the architecture's default."""
    dropout: float = 0.0
    """Dropout probability on attention probabilities and residual branches (0 disables the masks)."""
    rope_theta: float = 10000.0
    """RoPE base (llama only)."""
    norm_eps: float = 1e-5
    make_vocab_size_divisible_by: int = MEGATRON_VOCAB_DIVISOR
    """Megatron-LM's padding rule: the embedding and output projection get ``padded_vocab_size(tp)`` rows,
    the vocabulary rounded up to a multiple of this times the TP size, so that every TP rank holds an equal,
    GEMM-friendly share (GPT-2's 50,257 tokens become 50,304 at tp 1 and 51,200 at tp 8). The rows past
    ``vocab_size`` are never a target."""
    head_dim: int | None = None
    """Channels per attention head; None means hidden_size / num_attention_heads (resolved on creation, so
    ``spec.head_dim`` is always a number). Qwen3 decouples it (llama only): q is ``q_size`` wide.
    ``dataclasses.replace`` carries the resolved value over: give head_dim again when changing the width."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections, not on o (Qwen2; llama only: gpt has every bias already)."""
    qk_norm: bool = False
    """RMSNorm over head_dim (weights of head_dim, eps norm_eps) on each head of q and of k before RoPE
    (Qwen3; llama only)."""
    rope_scaling: RopeScaling | None = None
    """Llama 3.1's RoPE frequency scaling (llama only); None: plain RoPE."""
    max_positions: int | None = None
    """Rows of gpt's learned position table (Hugging Face's ``n_positions``); None means the training
    sequence length. A training sequence longer than this is refused (plan.py ``sequence_refusal``)."""
    activation: str | None = None
    """The MLP activation (``ACTIVATIONS``); None means the architecture's default (``mlp_activation``)."""
    sliding_window: int | None = None
    """The attention window in tokens (llama only): each query sees itself and the window - 1 tokens before
    it, in every block (Mistral) or in the blocks ``full_attention_interval`` leaves windowed (GPT-OSS).
    The planner prices the window; the runtime's attention is full causal, which is the windowed attention
    exactly while the training sequence fits the window, so ``autoplan run`` refuses a longer one
    (plan.py ``window_refusal``)."""
    full_attention_interval: int | None = None
    """With ``sliding_window``: block i attends to the whole sequence when i % interval == interval - 1 and
    through the window otherwise (GPT-OSS: 2, windowed blocks first; Hugging Face's ``layer_types``); None:
    every block is windowed."""
    o_bias: bool = False
    """A bias on the attention's output projection (GPT-OSS; a llama config with ``attention_bias: true``
    biases q, k, v and o). Planned; the runtime's llama has none (``runtime_refusal``)."""
    attention_sinks: bool = False
    """GPT-OSS's learned per-head sink logit in each block's softmax (one parameter per head). Planned; the
    runtime's attention has none (``runtime_refusal``)."""
    moe: MoESpec | None = None
    """Mixture-of-Experts feed-forward layers (llama only): the blocks ``moe.is_moe_layer`` names have a
    router and experts instead of the dense SwiGLU MLP of ``ffn_hidden_size`` (which the other blocks keep,
    e.g. DeepSeek-V3's first three); None: every block is dense."""
    mla: MLASpec | None = None
    """DeepSeek's multi-head latent attention (llama only): low-rank q and kv projections instead of q, k, v
    (``MLASpec.params``); head_dim is then the query/key head width qk_nope_head_dim + qk_rope_head_dim,
    and num_kv_heads equals num_attention_heads (each head gets its own key and value from the latent)."""
    mtp_layers: int = 0
    """DeepSeek-V3's multi-token-prediction modules (llama only; ``num_nextn_predict_layers``), trained to
    predict one more token ahead each: a block as block ``num_layers + i`` would be (MoE or dense), RMSNorms
    on the hidden state and on the next token's embedding (hnorm, enorm), a projection of their
    concatenation [h, 2h] (eh_proj) and a final RMSNorm, sharing the model's embedding and output head.
    Counted in ``total_params`` (``mtp_params``); inference may drop them."""

    def __post_init__(self) -> None:
        if self.tie_embeddings is None:
            object.__setattr__(self, "tie_embeddings", self.architecture == "gpt")
        if self.head_dim is None and self._derived_head_dim() is not None:
            object.__setattr__(self, "head_dim", self._derived_head_dim())

    def _derived_head_dim(self) -> int | None:
        """hidden_size / num_attention_heads where that is a whole positive number (else validate refuses);
        with MLA, the query/key head width (qk_nope_head_dim + qk_rope_head_dim)."""
        if isinstance(self.mla, MLASpec) and isinstance(self.mla.qk_nope_head_dim, int) \
                and isinstance(self.mla.qk_rope_head_dim, int):
            return self.mla.qk_head_dim
        h, heads = self.hidden_size, self.num_attention_heads
        ok = isinstance(h, int) and isinstance(heads, int) and heads > 0 and h > 0 and h % heads == 0
        return h // heads if ok else None

    def defaults_omitted(self) -> dict[str, Any]:
        """The fields ``to_dict`` leaves out while they hold these values, the ones they take when not given
        (head_dim's depends on the spec), so that a model without the newer features serialises as before."""
        return {"head_dim": self._derived_head_dim(), "qkv_bias": False, "qk_norm": False, "rope_scaling": None,
                "max_positions": None, "activation": None, "sliding_window": None, "moe": None, "mla": None,
                "mtp_layers": 0, "full_attention_interval": None, "o_bias": False, "attention_sinks": False}

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        for field, high in (("num_layers", MAX_LAYERS), ("hidden_size", MAX_HIDDEN_SIZE),
                            ("ffn_hidden_size", 4 * MAX_HIDDEN_SIZE), ("num_attention_heads", MAX_HIDDEN_SIZE),
                            ("num_kv_heads", MAX_HIDDEN_SIZE), ("vocab_size", MAX_VOCAB_SIZE),
                            ("seq_len", MAX_SEQ_LEN), ("head_dim", MAX_HIDDEN_SIZE)):
            require_range(self, field, 1, high)
        require(self.head_dim is not None, "hidden_size",
                f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
                + ("; give head_dim for a head width of its own" if self.architecture == "llama" else ""))
        require(self.num_attention_heads % self.num_kv_heads == 0, "num_kv_heads",
                f"{self.num_kv_heads} must divide num_attention_heads={self.num_attention_heads}")
        require(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        require_range(self, "make_vocab_size_divisible_by", 1, 2**16)
        require(1.0 < self.rope_theta <= 1e12, "rope_theta",
                f"{self.rope_theta} must be in (1, 1e12]: the RoPE base (10000 or 500000 in published models)")
        require(0.0 < self.norm_eps < 1.0, "norm_eps", f"{self.norm_eps} must be in (0, 1) (1e-5 or 1e-6 usually)")
        self._validate_features()
        require(self.total_params() <= MAX_PARAMS, "num_layers",
                f"the model would have {self.total_params():.3g} parameters, more than {MAX_PARAMS:.0e}")
        if self.architecture == "gpt":
            require(self.num_kv_heads == self.num_attention_heads, "num_kv_heads",
                    "gpt uses multi-head attention; set num_kv_heads equal to num_attention_heads")

    def _validate_features(self) -> None:
        """The optional features: each on the architecture whose runtime model has it, in range."""
        allowed = ACTIVATIONS[self.architecture]
        require(self.activation is None or self.activation in allowed, "activation",
                f"{self.activation!r} is not one {self.architecture} computes; use one of {', '.join(allowed)}")
        if self.architecture == "gpt":
            require(self.q_size == self.hidden_size, "head_dim",
                    f"{self.head_dim} x {self.num_attention_heads} heads is not hidden_size={self.hidden_size}; gpt "
                    "splits hidden_size into its heads: remove head_dim")
            for field in ("qkv_bias", "qk_norm", "rope_scaling", "sliding_window", "moe", "mla",
                          "full_attention_interval", "o_bias", "attention_sinks"):
                require(getattr(self, field) in (False, None), field,
                        "is a llama feature (gpt has biases everywhere, learned positions, full attention); "
                        "remove it or use architecture: llama")
            require(self.mtp_layers == 0, "mtp_layers", "is a llama feature (DeepSeek-V3's); remove it or use "
                    "architecture: llama")
        else:
            require(self.max_positions is None, "max_positions",
                    "is the rows of gpt's learned position table; llama has rotary positions: remove it")
        if self.rope_scaling is not None:
            try:
                self.rope_scaling.validate()
            except ValueError as err:
                raise type(err)(f"rope_scaling.{err}") from None
        require_range(self, "mtp_layers", 0, 16)
        self._validate_moe_mla()
        for field in ("max_positions", "sliding_window"):
            require_range(self, field, 1, MAX_SEQ_LEN)
        require(self.max_positions is None or self.seq_len <= self.max_positions, "seq_len",
                f"{self.seq_len} exceeds max_positions={self.max_positions}; use a seq_len of at most "
                f"{self.max_positions}")
        require_range(self, "full_attention_interval", 2, MAX_LAYERS)
        require(self.full_attention_interval is None or self.sliding_window is not None, "full_attention_interval",
                "needs sliding_window (the window of the other blocks); remove it for full attention everywhere")

    def _validate_moe_mla(self) -> None:
        for field in ("moe", "mla"):
            part = getattr(self, field)
            if part is None:
                continue
            try:
                part.validate()
            except ValueError as err:
                raise type(err)(f"{field}.{err}") from None
        if self.moe is not None:
            require(self.moe.num_moe_layers(self.num_layers) > 0, "moe.first_dense_layers",
                    f"{self.moe.first_dense_layers} (layer_frequency {self.moe.layer_frequency}) leaves no MoE block "
                    f"in num_layers={self.num_layers}; remove moe for a dense model")
        if self.mla is not None:
            require(self.head_dim == self.mla.qk_head_dim, "head_dim",
                    f"{self.head_dim} is not the MLA query/key head width qk_nope_head_dim + qk_rope_head_dim = "
                    f"{self.mla.qk_head_dim}: remove head_dim")
            require(self.num_kv_heads == self.num_attention_heads, "num_kv_heads",
                    f"{self.num_kv_heads}: multi-head latent attention gives every head its own key and value; "
                    f"set it to num_attention_heads={self.num_attention_heads}")
            for field in ("qkv_bias", "qk_norm"):
                require(not getattr(self, field), field, "does not apply to multi-head latent attention "
                        "(its q and kv projections are low-rank, with RMSNorms on the latents): remove it")

    def unpriced(self) -> str | None:
        """What of this model the cost model does not price, as a phrase; None if nothing. MoE blocks are
        priced as a leading run of dense blocks and then MoE ones (cost/moe_ops.py); dense blocks between MoE
        ones (Qwen2-MoE's ``decoder_sparse_step`` > 1) are not, and ``plan``/``estimate`` refuse them."""
        if self.moe is not None and self.moe.layer_frequency > 1:
            return f"dense blocks between MoE ones (moe.layer_frequency {self.moe.layer_frequency})"
        return None

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Rows of the embedding and the output projection at TP size ``tp`` (Megatron-LM's
        ``_vocab_size_with_padding``: round up to a multiple of make_vocab_size_divisible_by x tp)."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    @property
    def q_size(self) -> int:
        """Width of the Q projection output and of the O projection input: heads x head_dim (hidden_size
        unless head_dim is decoupled)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the K (and of the V) projection output."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_activation(self) -> str:
        """``activation``, or the architecture's default (gelu for gpt, silu for llama)."""
        return self.activation or ACTIVATIONS[self.architecture][0]

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size h x ffn in the MLP: 2 for a non-gated one (GELU, squared ReLU), 3 for
        SwiGLU (gate, up, down)."""
        return 2 if self.mlp_activation in NON_GATED else 3

    def is_windowed(self, layer: int) -> bool:
        """Block ``layer`` attends through ``sliding_window`` (module doc of the field)."""
        if self.sliding_window is None:
            return False
        interval = self.full_attention_interval
        return interval is None or layer % interval != interval - 1

    def windowed_layers(self) -> int:
        """How many of the ``num_layers`` blocks attend through the window."""
        return sum(self.is_windowed(i) for i in range(self.num_layers))

    def runtime_refusal(self) -> str | None:
        """What of this spec the runtime's reference models (runtime/models) do not compute, as a phrase;
        None if they compute all of it. The planner prices these; ``autoplan run`` refuses them in one line
        rather than train another model than the spec says."""
        parts = []
        if self.mlp_activation == "relu2":
            parts.append("a squared-ReLU MLP")
        if self.o_bias:
            parts.append("a bias on the attention output")
        if self.attention_sinks:
            parts.append("attention sinks")
        if self.full_attention_interval is not None:
            parts.append("windowed and full-attention blocks alternating")
        if self.mla is not None:
            parts.append("multi-head latent attention (mla)")
        if self.mtp_layers:
            parts.append(f"{self.mtp_layers} multi-token-prediction module(s) (mtp_layers)")
        if self.moe is not None:
            moe = self.moe
            parts += [what for what, has in (("a router bias (moe.router_bias)", moe.router_bias),
                                             ("expert biases (moe.expert_bias)", moe.expert_bias),
                                             ("a shared-expert gate (moe.shared_expert_gate)", moe.shared_expert_gate),
                                             ("an expert capacity factor (moe.capacity_factor)",
                                              moe.capacity_factor is not None),
                                             ("group-limited routing (moe.router_groups, moe.router_group_topk)",
                                              moe.group_limited)) if has]
        return ", ".join(parts) if parts else None

    def position_rows(self, seq_len: int | None = None) -> int:
        """Rows of gpt's learned position table: max_positions, else the training sequence length
        (``seq_len``, default the spec's)."""
        return self.max_positions or seq_len or self.seq_len

    def layer_params(self) -> int:
        """Parameters of one transformer block, biases and norm weights included: the block every layer is,
        which the cost model multiplies by the layers of a stage. Raises for an MoE model, whose blocks differ
        (dense and MoE ones): count those with ``block_params``, ``total_params`` and ``active_params``."""
        if self.moe is not None:
            raise SpecError(f"{self.name}: layer_params: the model has MoE blocks and dense ones, not one block; "
                            "count with block_params, total_params or active_params")
        return self._dense_block_params()

    def attention_params(self) -> int:
        """The attention of one block: q, k, v, o (with their biases and q/k norms), or MLA's projections."""
        h, q, kv = self.hidden_size, self.q_size, self.kv_size
        if self.mla is not None:
            return self.mla.params(h, self.num_attention_heads)
        attn = h * q + 2 * h * kv + q * h  # q, k, v, o
        if self.architecture == "gpt":
            return attn + q + 2 * kv + h
        biases = ((q + 2 * kv) if self.qkv_bias else 0) + (h if self.o_bias else 0)
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        sinks = self.num_attention_heads if self.attention_sinks else 0
        return attn + biases + qk_norms + sinks

    def _dense_block_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        mlp = self.mlp_matrices * h * f
        if self.architecture == "gpt":
            return self.attention_params() + mlp + (f + h) + 4 * h  # MLP biases; two LayerNorms with bias
        return self.attention_params() + mlp + 2 * h  # two RMSNorm weights

    def is_moe_block(self, layer: int) -> bool:
        """Block ``layer`` (0-based; ``num_layers + i`` is multi-token-prediction module i's) is an MoE block."""
        return self.moe is not None and self.moe.is_moe_layer(layer)

    def block_params(self, layer: int, active: bool = False) -> int:
        """Parameters of block ``layer``: dense, or attention, router, experts and shared experts, and two
        RMSNorms; ``active``: only those one token uses (its top-k experts of the routed ones)."""
        if not self.is_moe_block(layer):
            return self._dense_block_params()
        h = self.hidden_size
        mlp = self.moe.active_mlp_params(h) if active else self.moe.layer_mlp_params(h)
        return self.attention_params() + mlp + 2 * h

    def _blocks_params(self, active: bool) -> int:
        """Every block's parameters: the dense blocks alike, the MoE blocks alike."""
        n_moe = self.moe.num_moe_layers(self.num_layers) if self.moe is not None else 0
        total = (self.num_layers - n_moe) * self._dense_block_params()
        if n_moe:
            first = next(i for i in range(self.num_layers) if self.is_moe_block(i))
            total += n_moe * self.block_params(first, active)
        return total

    def mtp_params(self, active: bool = False) -> int:
        """The multi-token-prediction modules (``mtp_layers``): each a block (as block num_layers + i would
        be), enorm and hnorm (RMSNorms of h), eh_proj [h, 2h] and a final RMSNorm, sharing the embedding and
        the output head (not counted again: DeepSeek's checkpoint stores copies of both in its MTP layer,
        which the Hub's 685B for DeepSeek-V3 counts)."""
        h = self.hidden_size
        return sum(self.block_params(self.num_layers + i, active) + 2 * h * h + 3 * h for i in range(self.mtp_layers))

    def embedding_params(self) -> int:
        """Token embedding (+ learned positions for gpt, ``position_rows`` of them)."""
        pos = self.position_rows() * self.hidden_size if self.architecture == "gpt" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm + output projection (zero extra weights for the projection when tied)."""
        norm = 2 * self.hidden_size if self.architecture == "gpt" else self.hidden_size
        return norm + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    def total_params(self) -> int:
        """Every parameter: embedding, blocks (dense and MoE), head, and the multi-token-prediction modules
        without second copies of the embedding and head they share (DeepSeek-V3: 671.0B + 11.5B of MTP
        module; the Hub's 685B adds the module's stored copies of embedding and head, 2 x 0.93B)."""
        return (self.embedding_params() + self._blocks_params(active=False) + self.head_params()
                + self.mtp_params())

    def active_params(self) -> int:
        """Parameters one token's forward uses: as ``total_params`` with each MoE block's routed experts cut
        to the token's top k (router and shared experts included), embedding and head included (as
        Mixtral's 12.9B and DeepSeek-V3's 37B count). The multi-token-prediction modules count as in
        ``total_params`` (DeepSeek's 37B is without them: ``dataclasses.replace(spec, mtp_layers=0)``)."""
        return (self.embedding_params() + self._blocks_params(active=True) + self.head_params()
                + self.mtp_params(active=True))
