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

Mixture-of-Experts blocks (runtime/models/moe.py) hold each routed-expert matrix as one 3-D parameter,
``experts.gate`` / ``experts.up`` [E, F, H] and ``experts.down`` [E, H, F]; the Hub's checkpoints hold one
2-D tensor per expert (Mixtral ``block_sparse_moe.experts.{e}.w1`` / ``w3`` / ``w2``, Qwen3-MoE
``mlp.experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj``; transformers 5 fuses them in memory,
``experts.gate_up_proj``, but its ``save_pretrained`` writes them back per expert through its
conversion_mapping.py, so the per-expert form is what folders hold). Such a parameter's ``Source`` is a
key with ``{expert}`` in it and ``experts`` = E: expert e is the stored tensor of that key with e in it,
and row e of the runtime tensor's dim 0. The router ``router.weight`` [E, H] is ``block_sparse_moe.gate`` /
``mlp.gate``, one tensor. Only the MoE families whose routing the runtime's layer computes exactly are
mapped (``moe_family``): Mixtral (softmax over all experts, top-k, renormalised; every block MoE) and
Qwen3-MoE (the same with ``norm_topk_prob`` either way; leading dense blocks through ``mlp_only_layers``).
Qwen2-MoE gates its shared expert (``shared_expert_gate``), which the runtime's layer does not compute,
and DeepSeek's models need multi-head latent attention: both refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec


def moe_family(spec: ModelSpec) -> str:
    """The Hugging Face MoE family whose model computes exactly the runtime's MoE model of ``spec``: qwen3_moe
    with per-head q/k norms, mixtral without; or one SpecError line saying why none does. Both route as the
    runtime's MoE layer does (transformers' ``MixtralTopKRouter``, ``Qwen3MoeTopKRouter``): softmax over all
    E experts in fp32, the top k of those probabilities, renormalised to sum 1 (Mixtral always, Qwen3-MoE
    with ``norm_topk_prob``), no scaling, no shared expert."""
    why = _moe_refusal(spec)
    if why is None:
        return "qwen3_moe" if spec.qk_norm else "mixtral"
    raise SpecError(f"{spec.name}: moe: Hugging Face import and export (--init-from, --save-hf, export-hf) {why}")


def _moe_refusal(spec: ModelSpec) -> str | None:
    """Why no MoE family of ours computes ``spec`` (the rest of ``moe_family``'s line), or None."""
    moe = spec.moe
    unbuilt = spec.runtime_refusal()
    if spec.architecture != "llama" or spec.mla is not None or moe.router != "softmax":
        return ("cover mixtral and qwen3_moe; DeepSeek's models (sigmoid routing, multi-head latent attention) "
                "and MoE outside a llama model are not runnable by the runtime")
    if moe.shared_width:
        return ("cover routed experts only (mixtral, qwen3_moe); Qwen2-MoE's shared expert is gated by "
                "sigmoid(shared_expert_gate x), which the runtime's MoE layer does not compute")
    if unbuilt is not None:
        return f"cover what the runtime computes; this model has {unbuilt}"
    if moe.routed_scaling_factor != 1.0:
        return (f"cover mixtral and qwen3_moe, whose routed output is not scaled (routed_scaling_factor "
                f"{moe.routed_scaling_factor})")
    if spec.qkv_bias:
        return "cover mixtral and qwen3_moe; q/k/v biases are Qwen2-MoE's, whose gated shared expert the runtime lacks"
    if not spec.qk_norm:
        if moe.first_dense_layers or moe.layer_frequency != 1 or not moe.normalize_top_k:
            return ("cover mixtral (every block MoE, weights renormalised) and qwen3_moe (q/k norms); this model "
                    "without q/k norms has dense blocks or unnormalised weights, which Mixtral has not")
        return None
    if spec.sliding_window is not None:
        return "cover qwen3_moe with full attention only (the runtime's is not Qwen's sliding window)"
    if moe.first_dense_layers % moe.layer_frequency:
        return (f"write qwen3_moe, whose block i is MoE when (i + 1) % decoder_sparse_step == 0: first_dense_layers "
                f"{moe.first_dense_layers} must be a multiple of layer_frequency {moe.layer_frequency}")
    return None


def require_mapped(spec: ModelSpec) -> None:
    """One SpecError line unless this module maps ``spec``'s parameters (every dense model; the MoE models
    of ``moe_family``)."""
    if spec.moe is not None:
        moe_family(spec)


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

    experts: int = 0
    """0: one stored tensor. E > 0: the runtime tensor's dim 0 is E experts, each stored as its own tensor
    under ``key`` with ``{expert}`` replaced by its index (``per_expert``)."""
    expert: int | None = None
    """For one expert's stored tensor (``per_expert``): the index on the runtime tensor's dim 0 it is."""

    def out_dim(self, ndim: int) -> int:
        return 1 if self.transposed and ndim == 2 else 0


def per_expert(src: Source) -> list[Source]:
    """The stored tensors of a stacked parameter, expert 0 first (a one-tensor Source: itself)."""
    if not src.experts:
        return [src]
    return [Source(src.key.replace("{expert}", str(e)), expert=e) for e in range(src.experts)]


def family(spec: ModelSpec) -> str:
    """The Hugging Face ``model_type`` a spec is written as: gpt -> gpt2; an MoE model -> ``moe_family``;
    llama -> qwen3 with per-head q/k norms, qwen2 with q/k/v biases, mistral with a sliding window, else
    llama. (A spec does not record the folder it came from; these are the families that compute exactly
    the runtime's model.)"""
    if spec.moe is not None:
        return moe_family(spec)
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
    require_mapped(spec)
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
        elif spec.is_moe_block(i):  # no shared experts: moe_family refuses them
            e, fe = spec.moe.num_experts, spec.moe.expert_ffn_size
            out |= {f"{b}mlp.router.weight": (e, h), f"{b}mlp.experts.gate": (e, fe, h),
                    f"{b}mlp.experts.up": (e, fe, h), f"{b}mlp.experts.down": (e, h, fe)}
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
_MOE_BLOCK = {"mixtral": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
              "qwen3_moe": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})}
"""Per MoE family: the block's module holding the router (``.gate``) and the experts, and each expert's
matrix names (Mixtral's w1 gate, w3 up, w2 down: transformers 5's conversion_mapping.py concatenates w1 | w3
into ``experts.gate_up_proj`` and stacks w2 into ``experts.down_proj``, as Qwen's gate_proj | up_proj)."""
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
    require_mapped(spec)
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
    if module in ("mlp.router", "mlp.experts"):
        block, matrices = _MOE_BLOCK[moe_family(spec)]
        prefix = f"model.layers.{layer}.{block}"
        if module == "mlp.router":
            return Source(f"{prefix}.gate.{leaf}")
        return Source(f"{prefix}.experts.{{expert}}.{matrices[leaf]}.weight", experts=spec.moe.num_experts)
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
    for stacked, full_shape in sources(spec, seq_len).values():
        for src in per_expert(stacked):
            _add_stored(out, src, full_shape[1:] if stacked.experts else full_shape)
    return {k: tuple(v) for k, v in out.items()}


def _add_stored(out: dict[str, list[int]], src: Source, shape: tuple[int, ...]) -> None:
    """Record the stored tensor ``src`` holding a runtime tensor of ``shape`` (a fused one grows)."""
    stored = list(reversed(shape)) if src.transposed else list(shape)
    d = src.out_dim(len(shape))
    stored[d] += src.start
    if src.key in out:
        out[src.key][d] = max(out[src.key][d], stored[d])
    else:
        out[src.key] = stored


def pieces(spec: ModelSpec, seq_len: int | None = None) -> dict[str, list[tuple[str, Source]]]:
    """Hugging Face key -> the runtime parameters it is made of, in output order (export.py); one expert's
    tensor is its stacked parameter with the Source of that expert (``per_expert``)."""
    out: dict[str, list[tuple[str, Source]]] = {}
    for name, (stacked, _) in sources(spec, seq_len).items():
        for src in per_expert(stacked):
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
