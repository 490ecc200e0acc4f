"""Where each runtime parameter lives in a Hugging Face checkpoint, per family. Torch-free.

The runtime's names are the serial model's (runtime/models/__init__.py): ``embed.tok.weight``,
``blocks.{i}.attn.q.weight`` ... ``head.weight``, with ``[out, in]`` Linear weights. Hugging Face's
Llama family (llama, mistral, qwen2, qwen3) stores the same matrices under other names
(``model.layers.{i}.self_attn.q_proj.weight``), so a parameter is one tensor renamed. GPT-2 differs in
two ways (``transformers``' ``Conv1D``): its weights are stored ``[in, out]``, so the runtime's tensor is
the transpose, and q, k and v are one fused ``c_attn`` (``[h, 3h]``, bias ``[3h]``) whose output columns
``[0, h)``, ``[h, 2h)``, ``[2h, 3h)`` are q, k and v. A ``Source`` says both: the Hugging Face key, whether
the stored tensor is transposed, and where on its output dimension this parameter starts. Both
directions (loading a folder, exporting a checkpoint) are derived from this one table.

RoPE needs no permutation: the runtime's Llama rotates with Hugging Face's ``rotate_half`` convention,
so q and k weights map one to one. Buffers (RoPE tables) are derived from the spec, never stored.

Vocabulary tensors (``VOCAB_TENSORS``) are ``vocab_size`` rows here; the runtime pads them to the plan's
``padded_vocab_size`` with zero rows (load.py, export.py). A tied head is not stored: it is
``embed.tok.weight`` (runtime/models/init.py ``canonical_name``), and Hugging Face ties ``lm_head`` on load.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec


def require_dense(spec: ModelSpec) -> None:
    """Hugging Face folders in and out cover dense models only: an MoE model's router and 3-D expert weights
    have no mapping here yet (Mixtral / Qwen-MoE store one tensor per expert), so they are refused in one line
    rather than read or written as the dense model they are not."""
    if spec.moe is not None:
        raise SpecError(f"{spec.name}: moe: Hugging Face import and export (--init-from, --save-hf, export) cover "
                        "dense models only; the MoE expert weights have no mapping yet (issue 31)")

VOCAB_TENSORS = ("embed.tok.weight", "head.weight")
"""Runtime tensors with one row per vocabulary entry (padded in the runtime, ``vocab_size`` rows here)."""


@dataclass(frozen=True)
class Source:
    """A runtime parameter's place in a Hugging Face checkpoint."""

    key: str
    """The Hugging Face tensor name (as ``*ForCausalLM`` saves it; see ``resolve_key``)."""
    transposed: bool = False
    """Stored ``[in, out]`` (GPT-2's Conv1D): the runtime's ``[out, in]`` weight is its transpose."""
    start: int = 0
    """Index on the stored tensor's output dimension where this parameter begins (GPT-2's fused c_attn);
    the output dimension is 1 for a transposed weight, else 0."""

    def out_dim(self, ndim: int) -> int:
        return 1 if self.transposed and ndim == 2 else 0


def family(spec: ModelSpec) -> str:
    """The Hugging Face ``model_type`` a spec is written as: gpt -> gpt2; llama -> qwen3 with per-head q/k
    norms, qwen2 with q/k/v biases, mistral with a sliding window, else llama. (A spec does not record the
    folder it came from; these are the families that compute exactly the runtime's model.)"""
    require_dense(spec)
    if spec.architecture == "gpt":
        return "gpt2"
    if spec.qk_norm:
        return "qwen3"
    if spec.qkv_bias:
        return "qwen2"
    return "mistral" if spec.sliding_window else "llama"


def runtime_shapes(spec: ModelSpec, seq_len: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of the serial model (a tied head counted once, as the embedding) and its shape,
    vocabulary tensors unpadded; ``seq_len`` sizes gpt's position table when the spec has no max_positions."""
    require_dense(spec)
    h, f, q, kv, v = spec.hidden_size, spec.ffn_hidden_size, spec.q_size, spec.kv_size, spec.vocab_size
    gpt = spec.architecture == "gpt"
    norm = {"weight": (h,), "bias": (h,)} if gpt else {"weight": (h,)}
    out: dict[str, tuple[int, ...]] = {"embed.tok.weight": (v, h)}
    if gpt:
        out["embed.pos.weight"] = (spec.position_rows(seq_len), h)
    for i in range(spec.num_layers):
        b = f"blocks.{i}."
        out |= {f"{b}attn_norm.{k}": s for k, s in norm.items()}
        widths = {"q": q, "k": kv, "v": kv}
        out |= {f"{b}attn.{n}.weight": (w, h) for n, w in widths.items()}
        out[f"{b}attn.o.weight"] = (h, q)
        if gpt or spec.qkv_bias:
            out |= {f"{b}attn.{n}.bias": (w,) for n, w in widths.items()}
        if gpt:
            out[f"{b}attn.o.bias"] = (h,)
        if spec.qk_norm:
            out |= {f"{b}attn.q_norm.weight": (spec.head_dim,), f"{b}attn.k_norm.weight": (spec.head_dim,)}
        out |= {f"{b}mlp_norm.{k}": s for k, s in norm.items()}
        if gpt:
            out |= {f"{b}mlp.fc1.weight": (f, h), f"{b}mlp.fc1.bias": (f,), f"{b}mlp.fc2.weight": (h, f),
                    f"{b}mlp.fc2.bias": (h,)}
        else:
            out |= {f"{b}mlp.gate.weight": (f, h), f"{b}mlp.up.weight": (f, h), f"{b}mlp.down.weight": (h, f)}
    out |= {f"norm.{k}": s for k, s in norm.items()}
    if not spec.tie_embeddings:
        out["head.weight"] = (v, h)
    return out


_LLAMA_BLOCK = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
                "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
                "attn.o": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
                "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}
_GPT2_BLOCK = {"attn_norm": "ln_1", "mlp_norm": "ln_2", "attn.o": "attn.c_proj", "mlp.fc1": "mlp.c_fc",
               "mlp.fc2": "mlp.c_proj"}
_GPT2_FUSED = ("attn.q", "attn.k", "attn.v")
"""GPT-2's c_attn columns, in order."""


def _split(name: str) -> tuple[str, str, str]:
    """``blocks.3.attn.q.weight`` -> ("3", "attn.q", "weight"); ``norm.weight`` -> ("", "norm", "weight")."""
    stem, leaf = name.rsplit(".", 1)
    if stem.startswith("blocks."):
        _, layer, module = stem.split(".", 2)
        return layer, module, leaf
    return "", stem, leaf


def source(name: str, spec: ModelSpec) -> Source:
    """Where the runtime parameter ``name`` (canonical: runtime/models/init.py) is stored."""
    require_dense(spec)
    layer, module, leaf = _split(name)
    if spec.architecture == "gpt":
        if not layer:
            key = {"embed.tok": "transformer.wte", "embed.pos": "transformer.wpe", "norm": "transformer.ln_f",
                   "head": "lm_head"}[module]
            return Source(f"{key}.{leaf}")
        prefix = f"transformer.h.{layer}."
        if module in _GPT2_FUSED:
            start = sum(_fused_widths(spec)[:_GPT2_FUSED.index(module)])
            return Source(f"{prefix}attn.c_attn.{leaf}", transposed=leaf == "weight", start=start)
        return Source(f"{prefix}{_GPT2_BLOCK[module]}.{leaf}", transposed=leaf == "weight" and "norm" not in module)
    if not layer:
        key = {"embed.tok": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}[module]
        return Source(f"{key}.{leaf}")
    return Source(f"model.layers.{layer}.{_LLAMA_BLOCK[module]}.{leaf}")


def _fused_widths(spec: ModelSpec) -> list[int]:
    return [spec.q_size, spec.kv_size, spec.kv_size]


def sources(spec: ModelSpec, seq_len: int | None = None) -> dict[str, tuple[Source, tuple[int, ...]]]:
    """runtime name -> (its Source, its runtime shape), for every parameter of the serial model."""
    return {name: (source(name, spec), shape) for name, shape in runtime_shapes(spec, seq_len).items()}


def stored_shapes(spec: ModelSpec, seq_len: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a folder for ``spec`` must hold, with its shape (fused tensors whole).
    gpt's position table: the runtime's rows; a folder may hold more (files.py accepts a longer one)."""
    out: dict[str, list[int]] = {}
    for src, shape in sources(spec, seq_len).values():
        stored = list(reversed(shape)) if src.transposed else list(shape)
        d = src.out_dim(len(shape))
        stored[d] += src.start
        if src.key in out:
            out[src.key][d] = max(out[src.key][d], stored[d])
        else:
            out[src.key] = stored
    return {k: tuple(v) for k, v in out.items()}


def pieces(spec: ModelSpec, seq_len: int | None = None) -> dict[str, list[tuple[str, Source]]]:
    """Hugging Face key -> the runtime parameters it is made of, in output order (export.py)."""
    out: dict[str, list[tuple[str, Source]]] = {}
    for name, (src, _) in sources(spec, seq_len).items():
        out.setdefault(src.key, []).append((name, src))
    return {k: sorted(v, key=lambda item: item[1].start) for k, v in out.items()}


BASE_PREFIXES = ("model.", "transformer.")
"""What ``*ForCausalLM`` puts before the base model's names; a folder saved from the base model
(``GPT2Model``: the Hub's original ``gpt2`` stores ``h.0.attn.c_attn.weight``, ``wte.weight``) lacks it."""


def resolve_key(key: str, available) -> str | None:
    """``key`` as the folder spells it: itself, or without the base-model prefix; None if absent."""
    if key in available:
        return key
    for prefix in BASE_PREFIXES:
        if key.startswith(prefix) and key[len(prefix):] in available:
            return key[len(prefix):]
    return None


def stored_box(src: Source, box: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The [start, stop) ranges to read from the stored tensor for the runtime box ``box`` (one range per
    runtime dimension); the read is transposed afterwards when ``src.transposed``."""
    ranges = list(reversed(box)) if src.transposed and len(box) == 2 else list(box)
    d = src.out_dim(len(box))
    lo, hi = ranges[d]
    ranges[d] = (lo + src.start, hi + src.start)
    return ranges
