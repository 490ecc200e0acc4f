"""The model spec: the shape of a decoder-only transformer, as the planner and the runtime both read it.

Naming: "layer" means one transformer block; the embedding in front and the head (final norm + logits)
behind are not counted in ``num_layers``. "heads" are query heads; ``num_kv_heads`` < ``num_attention_heads``
is grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_range
from autoplan.schema.limits import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_PARAMS, MAX_SEQ_LEN, MAX_VOCAB_SIZE

Architecture = Literal["gpt", "llama"]
MEGATRON_VOCAB_DIVISOR = 128
"""Megatron-LM's default ``--make-vocab-size-divisible-by``."""


@dataclass(frozen=True)
class ModelSpec:
    """A transformer the cost model has formulas for and the runtime has a reference implementation of.

    ``gpt``: LayerNorm, GELU MLP (two matrices), learned positions, biases, tied embedding by default.
    ``llama``: RMSNorm, SwiGLU MLP (three matrices), rotary positions, no biases, untied by default.
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

    def __post_init__(self) -> None:
        if self.tie_embeddings is None:
            object.__setattr__(self, "tie_embeddings", self.architecture == "gpt")

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        for field, high in (("num_layers", MAX_LAYERS), ("hidden_size", MAX_HIDDEN_SIZE),
                            ("ffn_hidden_size", 4 * MAX_HIDDEN_SIZE), ("num_attention_heads", MAX_HIDDEN_SIZE),
                            ("num_kv_heads", MAX_HIDDEN_SIZE), ("vocab_size", MAX_VOCAB_SIZE),
                            ("seq_len", MAX_SEQ_LEN)):
            require_range(self, field, 1, high)
        require(self.hidden_size % self.num_attention_heads == 0, "hidden_size",
                f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}")
        require(self.num_attention_heads % self.num_kv_heads == 0, "num_kv_heads",
                f"{self.num_kv_heads} must divide num_attention_heads={self.num_attention_heads}")
        require(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        require_range(self, "make_vocab_size_divisible_by", 1, 2**16)
        require(1.0 < self.rope_theta <= 1e12, "rope_theta",
                f"{self.rope_theta} must be in (1, 1e12]: the RoPE base (10000 or 500000 in published models)")
        require(0.0 < self.norm_eps < 1.0, "norm_eps", f"{self.norm_eps} must be in (0, 1) (1e-5 or 1e-6 usually)")
        require(self.total_params() <= MAX_PARAMS, "num_layers",
                f"the model would have {self.total_params():.3g} parameters, more than {MAX_PARAMS:.0e}")
        if self.architecture == "gpt":
            require(self.num_kv_heads == self.num_attention_heads, "num_kv_heads",
                    "gpt uses multi-head attention; set num_kv_heads equal to num_attention_heads")

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Rows of the embedding and the output projection at TP size ``tp`` (Megatron-LM's
        ``_vocab_size_with_padding``: round up to a multiple of make_vocab_size_divisible_by x tp)."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the K (and of the V) projection output."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size h x ffn in the MLP: 2 for GELU, 3 for SwiGLU (gate, up, down)."""
        return 3 if self.architecture == "llama" else 2

    def layer_params(self) -> int:
        """Parameters of one transformer block, biases and norm weights included."""
        h, f, kv = self.hidden_size, self.ffn_hidden_size, self.kv_size
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o
        mlp = self.mlp_matrices * h * f
        if self.architecture == "gpt":
            return attn + mlp + (h + 2 * kv + h) + (f + h) + 4 * h  # biases; two LayerNorms with bias
        return attn + mlp + 2 * h  # two RMSNorm weights

    def embedding_params(self) -> int:
        """Token embedding (+ learned positions for gpt)."""
        pos = self.seq_len * self.hidden_size if self.architecture == "gpt" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm + output projection (zero extra weights for the projection when tied)."""
        norm = 2 * self.hidden_size if self.architecture == "gpt" else self.hidden_size
        return norm + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    def total_params(self) -> int:
        return self.embedding_params() + self.num_layers * self.layer_params() + self.head_params()
