"""The runtime's reference models compute what ``transformers`` computes, for every Hugging Face family a
``config.json`` maps onto (autoplan/schema/hf_config.py): Llama 3.1 (``rope_scaling`` llama3), Mistral,
Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm, head_dim 24 with hidden 64 / 4 heads) and GPT-2 (a position
table of n_positions 256 rows trained at 32 tokens, ``gelu_new``).

Each case builds a tiny random ``transformers`` model in fp32, writes its config.json with
``save_pretrained``, maps that file to a ModelSpec, builds the runtime's model from it, copies the weights
over by the name map below (written here, independently of the runtime's checkpoint loader; GPT-2's
``Conv1D`` weights are stored [in, out] and transposed, its fused ``c_attn`` split into q, k, v), and
compares the logits of the same tokens. Every weight is first moved off its initial value (norm weights
off 1, biases off 0), so a bias, a norm or a gain the runtime dropped would show.

Tolerance: max |difference| / max |logit| <= 1e-5 in fp32. Both sides run the same maths with kernels
that may sum in another order (SDPA against transformers' eager attention, fused against composed
RMSNorm), a few ulps per op (measured: ~1e-7 here); a wrong RoPE pairing, a missing scaling rule, the
exact GELU for the tanh one or a norm on the wrong axis moves the logits by 1e-4 to 1e0 (the controls
below show the two subtlest, RoPE scaling and the GELU form, fail the bound).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from autoplan.schema.hf_config import spec_from_hf_config
from runtime.models import build_model

transformers = pytest.importorskip("transformers")

SEQ = 32
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=300,
            max_position_embeddings=256, bos_token_id=0, eos_token_id=0)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}  # 16 < SEQ: the scaled wavelengths matter here
FAMILIES = {
    "llama3.1": ("LlamaConfig", dict(TINY, num_key_value_heads=2, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0)),
    "mistral": ("MistralConfig", dict(TINY, num_key_value_heads=2, sliding_window=64)),
    "qwen2": ("Qwen2Config", dict(TINY, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(TINY, num_key_value_heads=2, head_dim=24)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=256,
                                activation_function="gelu_new", bos_token_id=0, eos_token_id=0)),
}
TOLERANCE = 1e-5

LLAMA_NAMES = [  # transformers' LlamaForCausalLM family -> the runtime's Llama
    (r"model\.embed_tokens\.weight", "embed.tok.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight", r"blocks.\1.attn.\2_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp_norm.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "head.weight"),
]
GPT2_NAMES = [  # GPT2LMHeadModel -> the runtime's GPT; "T" marks a Conv1D weight ([in, out]: transposed)
    (r"transformer\.wte\.weight", "embed.tok.weight"),
    (r"transformer\.wpe\.weight", "embed.pos.weight"),
    (r"transformer\.h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.attn_norm.\2"),
    (r"transformer\.h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.mlp_norm.\2"),
    (r"transformer\.h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"T blocks.\1.attn.o.\2"),
    (r"transformer\.h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"T blocks.\1.mlp.fc1.\2"),
    (r"transformer\.h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"T blocks.\1.mlp.fc2.\2"),
    (r"transformer\.ln_f\.(weight|bias)", r"norm.\1"),
    (r"lm_head\.weight", "head.weight"),
]


def runtime_state(hf_state: dict[str, torch.Tensor], gpt: bool) -> dict[str, torch.Tensor]:
    """The runtime's state dict holding ``hf_state``'s values; every transformers tensor must map."""
    out = {}
    for name, value in hf_state.items():
        split = re.fullmatch(r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)", name)
        if gpt and split:  # fused [in, 3h] (weight) / [3h] (bias): q, k, v side by side
            i, kind = split.groups()
            parts = value.t().chunk(3, dim=0) if kind == "weight" else value.chunk(3)
            out |= {f"blocks.{i}.attn.{p}.{kind}": t.contiguous() for p, t in zip("qkv", parts)}
            continue
        for pattern, target in GPT2_NAMES if gpt else LLAMA_NAMES:
            if re.fullmatch(pattern, name):
                target = re.sub(pattern, target, name)
                transpose = target.startswith("T ") and value.dim() == 2
                out[target.removeprefix("T ")] = value.t().contiguous() if transpose else value
                break
        else:
            raise AssertionError(f"no runtime name for transformers' {name}")
    return out


def family(name: str, tmp_path, seed: int = 0):
    """(transformers model with every weight moved off its initial value, its spec from config.json)."""
    cls, kwargs = FAMILIES[name]
    config = getattr(transformers, cls)(**kwargs)
    config.save_pretrained(tmp_path)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for p in hf.parameters():  # norm weights off 1, biases off 0, matrices perturbed
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.1))
    return hf, spec_from_hf_config(tmp_path / "config.json")


def runtime_logits(spec, hf, tokens: torch.Tensor, gpt: bool) -> torch.Tensor:
    model = build_model(spec, seq_len=SEQ).eval()
    model.load_state_dict(runtime_state(hf.state_dict(), gpt), strict=True)
    with torch.no_grad():
        return model(tokens)


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_equal_transformers(name, tmp_path):
    hf, spec = family(name, tmp_path)
    gpt = name == "gpt2"
    tokens = torch.randint(0, spec.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=tokens, use_cache=False).logits
    got = runtime_logits(spec, hf, tokens, gpt)
    diff = relative_difference(got, want)
    print(f"{name}: max relative logit difference {diff:.2e}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize(("name", "change"), [("llama3.1", {"rope_scaling": None}),
                                              ("gpt2", {"activation": None})],
                         ids=["without rope scaling", "exact gelu for gelu_new"])
def test_the_comparison_sees_the_subtle_features(name, change, tmp_path):
    """Controls: the same weights with Llama 3.1's scaling dropped, or the exact GELU for GPT-2's tanh
    form, miss the bound, so the test above would catch either mistake."""
    hf, spec = family(name, tmp_path)
    tokens = torch.randint(0, spec.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=tokens, use_cache=False).logits
    diff = relative_difference(runtime_logits(dataclasses.replace(spec, **change), hf, tokens, name == "gpt2"), want)
    print(f"{name} with {change}: max relative logit difference {diff:.2e}")
    assert diff > 10 * TOLERANCE


@pytest.mark.parametrize("name", list(FAMILIES))
def test_parameter_counts_agree(name, tmp_path):
    """The runtime's module, the planner's formula and transformers count the same parameters (a tied
    embedding once)."""
    hf, spec = family(name, tmp_path)
    built = sum(p.numel() for p in build_model(spec, device="meta", seq_len=SEQ).parameters())
    print(f"{name}: {built:,} parameters")
    assert built == spec.total_params() == hf.num_parameters()
