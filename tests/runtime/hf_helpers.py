"""Test helpers for Hugging Face folders: a tiny random ``transformers`` model per family saved as a folder,
a world of one in-process, and training the ``transformers`` model itself as the serial reference."""

from __future__ import annotations

import contextlib
import functools
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autoplan.schema import ModelSpec
from autoplan.schema.hf_config import spec_from_hf_config

SEQ_LEN = 32
VOCAB = 300
"""Not a multiple of 128: the runtime pads it (384 rows at tp1, 512 at tp2), so the padding rows are tested."""
_LLAMA_SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128)


def family_config(family: str):
    """A tiny config of each family with what makes it differ: Llama 3.1's RoPE scaling (its original
    context 16 < 32 rescales most frequencies), Mistral's window (and an odd MLP width), Qwen2's q/k/v biases and tied embedding,
    Qwen3's q/k norms and head_dim 24 != 64 / 4, GPT-2's Conv1D, fused c_attn, tanh GELU and a position
    table longer than the training sequence. Dropout 0 everywhere (the comparison is of the functions)."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if family == "llama":
        return LlamaConfig(**_LLAMA_SIZES, rope_theta=500000.0, rms_norm_eps=1e-5,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    if family == "mistral":  # an odd MLP width: FSDP2's shards of gate / up are uneven (49 + 48 rows)
        return MistralConfig(**(_LLAMA_SIZES | {"intermediate_size": 97}), sliding_window=64)
    if family == "qwen2":
        return Qwen2Config(**_LLAMA_SIZES, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**_LLAMA_SIZES, head_dim=24)
    if family == "gpt2":
        return GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    raise ValueError(family)


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")


def random_hf_model(family: str, seed: int = 0):
    """The family's tiny model in fp32 with every parameter random (biases and norm weights too, so a
    wrong mapping of any of them shows in the logits)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = ("norm" in name or ".ln_" in name) and name.endswith("weight")
            p.normal_(1.0 if is_norm else 0.0, 0.05)
    return model.eval()


def save_hf_folder(model, folder: Path, sharded: bool = False) -> Path:
    """``save_pretrained`` as safetensors; ``sharded``: 100 KB shards and an index (several files)."""
    model.save_pretrained(folder, safe_serialization=True, **({"max_shard_size": "100KB"} if sharded else {}))
    return folder


@functools.lru_cache(maxsize=None)
def saved_once(name: str, build: Callable[[str], Any], sharded: bool = False) -> Path:
    """``build(name)``'s model saved by ``save_hf_folder`` once per session, in a fresh temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"autoplan-hf-{name}-"))
    return save_hf_folder(build(name), folder / name, sharded=sharded)


def folder_spec(folder: Path) -> ModelSpec:
    """The model spec a Hugging Face folder's config.json maps to."""
    return spec_from_hf_config(folder / "config.json")


@contextlib.contextmanager
def world_of_one():
    """A gloo process group of one rank in this process (what a 1-device plan runs on)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: the difference relative to the tensor's scale."""
    return float((a - b).abs().max() / b.abs().max())


def hf_training_losses(model, plan, steps: int) -> list[float]:
    """``transformers``' model trained with plain PyTorch on the runtime's global batches, with the plan's
    AdamW, LR schedule and clipping (rt_helpers.reference_steps, as serial_run): the serial reference a
    run started from its folder must reproduce."""
    from rt_helpers import reference_steps
    from runtime.train.data import TokenSource

    t = plan.training
    data = TokenSource(plan.model.vocab_size, t.seq_len, t.seed)

    def loss_at(step: int) -> torch.Tensor:
        x, y = data.global_batch(step, t.global_batch_size)
        return F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())

    model.train()
    losses, _ = reference_steps(list(model.parameters()), t, steps, loss_at)
    model.eval()
    return losses


# ------------------------------------------------------------------------------ Mixture-of-Experts families
MOE_FAMILIES = ("mixtral", "qwen3_moe", "qwen3_moe_dense0")
"""Tiny MoE models of the families runtime/hf maps: Mixtral (every block MoE, weights renormalised),
Qwen3-MoE as its config class defaults it (norm_topk_prob false: the chosen weights not renormalised) and
with a leading dense block (mlp_only_layers [0]) and norm_topk_prob true."""
_MOE_SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=VOCAB, max_position_embeddings=128, num_experts_per_tok=2,
                  router_aux_loss_coef=0.0)
"""2 layers, 4 experts, top 2. No auxiliary loss (transformers adds none to its loss unless
output_router_logits, the runtime adds its own when the coefficient is > 0): training compares equal."""


def moe_family_config(name: str):
    """The config of one of ``MOE_FAMILIES``: 4 experts of width 48, top 2 (Qwen3's head_dim 24 != 64 / 4)."""
    from transformers import MixtralConfig, Qwen3MoeConfig

    if name == "mixtral":
        return MixtralConfig(**_MOE_SIZES, intermediate_size=48, num_local_experts=4)
    if name in ("qwen3_moe", "qwen3_moe_dense0"):
        dense0 = name == "qwen3_moe_dense0"
        return Qwen3MoeConfig(**_MOE_SIZES, intermediate_size=96, moe_intermediate_size=48, num_experts=4,
                              head_dim=24, norm_topk_prob=dense0, mlp_only_layers=[0] if dense0 else [])
    raise ValueError(name)


def random_hf_moe_model(name: str, seed: int = 0):
    """One of ``MOE_FAMILIES`` in fp32 with every parameter random (as ``random_hf_model``: norm weights
    around 1, the router and every expert's matrices drawn, so a swapped gate / up or a wrong expert shows)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_family_config(name), dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.normal_(1.0 if "norm" in pname and pname.endswith("weight") else 0.0, 0.05)
    return model.eval()
