"""A Hugging Face ``config.json`` as a ModelSpec, where the config describes a model the runtime builds.

``llama``, ``mistral``, ``qwen2`` and ``qwen3`` configs map onto ``architecture: llama`` (RMSNorm, SwiGLU,
RoPE, GQA; Qwen2 adds biases on q, k and v, Qwen3 a per-head RMSNorm on q and k and a head width of its
own), ``gpt2`` onto ``architecture: gpt`` (LayerNorm, GELU, learned positions, tied embedding). The mapping
keeps every number the runtime's model needs to compute what ``transformers`` computes from the same
weights (tests/runtime/test_hf_families.py compares the logits); what it cannot keep is refused with the
key that breaks it: biases on o or on the MLP, another activation, a RoPE scaling other than Llama 3.1's
(``rope_type: llama3``), sliding-window layers in a Qwen model.

RoPE settings are read where either generation of ``transformers`` writes them: ``rope_theta`` and
``rope_scaling`` at the top level (4.x, the Hub's configs), or one ``rope_parameters`` object holding
``rope_theta`` and ``rope_type`` (5.x, ``save_pretrained``); as in ``transformers``, the object wins.

The training sequence length is not in a config: it is Mistral's ``sliding_window`` (the span it was
trained with; attention over at most that many tokens is plain causal attention), else
``max_position_embeddings`` (``n_positions`` for GPT-2, which is also the rows of its position table).
``--seq-len`` overrides it as for any spec, up to the window or the table (plan.py ``sequence_refusal``).

Every key the mapping reads is checked once, before anything is derived from it (``_FIELDS``): its JSON
type (an integer is a JSON integer, never ``4.0``, ``"4"`` or ``true``; a number is finite; a flag is
``true`` or ``false``), whether it may be ``null`` (where Hugging Face allows it), and its range. A
mistake is one SpecError line: the file, the key, what is wrong and the fix. llama, mistral and qwen
configs must give their five sizes; GPT-2's config class has a default for every key, so a gpt2 config
may omit any. A key that is absent takes the default of the family's config class in ``transformers``
(``_ABSENT``). Keys the mapping does not read are ignored, as Hugging Face ignores them.

Torch-free (the planner reads configs without transformers or torch).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import SpecError
from autoplan.schema._files import decode_utf8, read_bytes
from autoplan.schema.limits import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB_SIZE, MAX_YAML_BYTES
from autoplan.schema.model import ModelSpec, RopeScaling

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
GPT2_GELUS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
"""Hugging Face's GELU names the runtime computes, and the ModelSpec ``activation`` each is: the exact erf
form, or the tanh approximation GPT-2 uses (``gelu_new``)."""


# ------------------------------------------------------------------------------------------ the keys
@dataclass(frozen=True)
class _Field:
    kind: str
    """"int" (a JSON integer), "float" (a finite JSON number), "bool", "str" or "object"."""
    what: str
    """What the key means, for the message."""
    example: Any
    """A typical value, for the fix."""
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False


def _count(what: str, example: int, high: int, nullable: bool = False) -> _Field:
    return _Field("int", what, example, nullable, low=1, high=high)


_PROBABILITY = dict(low=0.0, high=1.0, high_open=True)
_EPSILON = dict(low=0.0, high=1.0, low_open=True, high_open=True)

_LLAMA: dict[str, _Field] = {
    "num_hidden_layers": _count("the number of transformer blocks", 32, MAX_LAYERS),
    "hidden_size": _count("the model width", 4096, MAX_HIDDEN_SIZE),
    "intermediate_size": _count("the MLP width", 11008, 4 * MAX_HIDDEN_SIZE),
    "num_attention_heads": _count("the number of query heads", 32, MAX_HIDDEN_SIZE),
    "vocab_size": _count("the number of tokens", 32000, MAX_VOCAB_SIZE),
    "num_key_value_heads": _count("the number of key/value heads; null means one per query head", 8,
                                  MAX_HIDDEN_SIZE, nullable=True),
    "head_dim": _count("the width of one head; null means hidden_size / num_attention_heads", 128,
                       MAX_HIDDEN_SIZE, nullable=True),
    "max_position_embeddings": _count("the longest sequence in tokens", 4096, MAX_SEQ_LEN),
    "sliding_window": _count("the attention window in tokens; null means none", 4096, MAX_SEQ_LEN,
                             nullable=True),
    "rope_theta": _Field("float", "the RoPE base", 10000.0, low=1.0, high=1e12, low_open=True),
    "rms_norm_eps": _Field("float", "the RMSNorm epsilon; 1e-05 or 1e-06 usually", 1e-05, **_EPSILON),
    "attention_dropout": _Field("float", "a dropout probability; 0.0 disables it", 0.0, **_PROBABILITY),
    "tie_word_embeddings": _Field("bool", "whether the output projection shares the embedding", False),
    "attention_bias": _Field("bool", "biases on the attention projections", False),
    "mlp_bias": _Field("bool", "biases on the MLP projections", False),
    "hidden_act": _Field("str", "the MLP activation", "silu"),
    "rope_scaling": _Field("object", "the RoPE scaling rule", {"rope_type": "llama3"}, nullable=True),
    "rope_parameters": _Field("object", "the RoPE base and scaling rule", {"rope_type": "default"}, nullable=True),
    "use_sliding_window": _Field("bool", "sliding-window attention in the upper layers (Qwen)", False),
}
_LLAMA_REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")

_ABSENT: dict[str, dict[str, Any]] = {
    # what each family's config class in transformers 5 takes for a key the file does not give
    "llama": {"num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "sliding_window": None},
    "mistral": {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-6, "sliding_window": 4096},
    "qwen2": {"num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "sliding_window": None},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "sliding_window": None},
}
_REFUSED_FLAGS: dict[str, dict[str, str]] = {
    # keys whose true the runtime's model cannot compute, by family, and why
    "llama": {"attention_bias": "it biases o_proj too, which the runtime's llama has no bias on",
              "mlp_bias": "the runtime's llama has no MLP biases"},
    "mistral": {"attention_bias": "it biases o_proj too, which the runtime's llama has no bias on",
                "mlp_bias": "the runtime's llama has no MLP biases"},
    "qwen2": {"use_sliding_window": "the runtime's attention is full causal in every layer"},
    "qwen3": {"attention_bias": "it biases o_proj too, which the runtime's model has no bias on",
              "use_sliding_window": "the runtime's attention is full causal in every layer"},
}
_ROPE_LLAMA3: dict[str, _Field] = {
    "factor": _Field("float", "the divisor of the low frequencies", 8.0, low=1.0, high=1e6),
    "low_freq_factor": _Field("float", "the low-frequency bound", 1.0, low=0.0, high=1e6, low_open=True),
    "high_freq_factor": _Field("float", "the high-frequency bound", 4.0, low=0.0, high=1e6, low_open=True),
    "original_max_position_embeddings": _count("the pretraining context in tokens", 8192, MAX_SEQ_LEN),
    "rope_theta": _Field("float", "the RoPE base", 10000.0, low=1.0, high=1e12, low_open=True),
    "partial_rotary_factor": _Field("float", "the share of each head RoPE rotates", 1.0, low=0.0, high=1.0,
                                    low_open=True),
}

_GPT2: dict[str, _Field] = {
    "n_layer": _count("the number of transformer blocks", 12, MAX_LAYERS),
    "n_embd": _count("the model width", 768, MAX_HIDDEN_SIZE),
    "n_inner": _count("the MLP width; null means 4 * n_embd", 3072, 4 * MAX_HIDDEN_SIZE, nullable=True),
    "n_head": _count("the number of attention heads", 12, MAX_HIDDEN_SIZE),
    "vocab_size": _count("the number of tokens", 50257, MAX_VOCAB_SIZE),
    "n_positions": _count("the longest sequence in tokens", 1024, MAX_SEQ_LEN),
    "resid_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "embd_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "attn_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "layer_norm_epsilon": _Field("float", "the LayerNorm epsilon; 1e-05 usually", 1e-05, **_EPSILON),
    "tie_word_embeddings": _Field("bool", "whether the output projection shares the embedding", True),
    "activation_function": _Field("str", "the MLP activation", "gelu_new"),
    "scale_attn_weights": _Field("bool", "scaling the attention scores by 1 / sqrt(head_dim)", True),
    "scale_attn_by_inverse_layer_idx": _Field("bool", "scaling the scores by 1 / (layer + 1) too", False),
    "add_cross_attention": _Field("bool", "cross-attention layers (encoder-decoder use)", False),
}


# ----------------------------------------------------------------------------------- reading the file
def is_hf_config(path: str | os.PathLike) -> bool:
    """A .json file with a ``model_type`` key. Also, so that ``spec_from_hf_config`` says what is wrong with
    it rather than the model-spec loader: a file named ``config.json`` that is an object without
    ``architecture`` (a ModelSpec's key; Hugging Face's is ``architectures``), and a .json file that is not
    a JSON object at all (empty, not UTF-8, broken JSON, a list, a string) and is named ``config.json`` or
    mentions ``model_type``. Never raises."""
    p = Path(path)
    try:
        if p.suffix != ".json" or not p.is_file():
            return False
        raw = _read(p)
    except (OSError, ValueError):  # SpecError is a ValueError: too large, unreadable; the spec loader says so
        return False
    try:
        data = _parse(p, raw)
    except SpecError:
        data = None
    if isinstance(data, dict):
        return "model_type" in data or (p.name == "config.json" and "architecture" not in data)
    return p.name == "config.json" or b"model_type" in raw


def spec_from_hf_config(path: str | os.PathLike, name: str | None = None) -> ModelSpec:
    p = Path(path)
    data = _parse(p, _read(p))
    if not isinstance(data, dict):
        raise SpecError(f"{p}: the top level is a JSON {_json_type(data)}, not an object; a Hugging Face "
                        "config.json is one {...} object with a model_type key")
    if "model_type" not in data:
        raise SpecError(f"{p}: model_type: missing; a Hugging Face config names its family "
                        f"({', '.join(FAMILIES)} map onto a ModelSpec)")
    kind = data["model_type"]
    if name is None:
        name = (Path(os.path.abspath(p)).parent.name if p.name == "config.json" else p.stem)[:200] or "model"
    if kind in ("llama", "mistral", "qwen2", "qwen3"):
        spec = _llama(p, data, name)
    elif kind == "gpt2":
        spec = _gpt2(p, data, name)
    else:
        shown = repr(kind) if isinstance(kind, str) and len(kind) <= 60 else _show(kind)
        raise SpecError(f"{p}: model_type {shown} has no ModelSpec mapping ({', '.join(FAMILIES)} have); "
                        "profile it with autoplan profile and plan the profile")
    try:
        spec.validate()
    except SpecError as err:
        raise SpecError(f"{p}: {err}") from None
    return spec


def _read(p: Path) -> bytes:
    """The bytes of a regular file of at most MAX_YAML_BYTES (a config.json is a few KiB)."""
    return read_bytes(p, MAX_YAML_BYTES, "a JSON config file", "a config.json")


def _parse(p: Path, raw: bytes) -> Any:
    text = decode_utf8(raw, str(p))
    if not text.strip():
        raise SpecError(f"{p}: empty file; a Hugging Face config.json is one {{...}} object with a model_type key")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{p}: not valid JSON (line {err.lineno} column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise SpecError(f"{p}: JSON nested too deeply to be a config (a config.json nests a few levels)") from None
    except ValueError as err:  # an integer of more than sys.get_int_max_str_digits() digits
        raise SpecError(f"{p}: not a config: a number in it is too long "
                        f"({str(err).split(';')[0].strip()})") from None


# ------------------------------------------------------------------------------- checking the values
def _check(p: Path, data: dict[str, Any], family: str, fields: dict[str, _Field],
           required: tuple[str, ...] = ()) -> None:
    """Each key of ``fields`` that ``data`` has is of its type, null only where allowed, and in range."""
    for key in required:
        if key not in data:
            f = fields[key]
            raise SpecError(f"{p}: {key}: missing; a {family} config must give it ({f.what}), e.g. "
                            f"\"{key}\": {_show(f.example)}")
    for key, f in fields.items():
        if key in data:
            _check_value(p, key, data[key], f, key in required)


def _check_value(p: Path, key: str, value: Any, f: _Field, required: bool) -> None:
    where = f"{p}: {key}: {_show(value)}"
    if value is None:
        if f.nullable:
            return
        default = "" if required else " or delete the key (the default applies)"
        raise SpecError(f"{where} is not allowed ({f.what}); write a value such as {_show(f.example)}{default}")
    or_null = " or null" if f.nullable else ""
    if f.kind == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
        raise SpecError(f"{where} is not an integer ({f.what}); write {_int_fix(value, f.example)}{or_null}")
    if f.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where} is not a number ({f.what}); write {_float_fix(value, f.example)}{or_null}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{where} is not a finite number ({f.what}); write a number such as "
                            f"{_show(f.example)}{or_null}")
    if f.kind == "bool" and not isinstance(value, bool):
        raise SpecError(f"{where} is not true or false ({f.what}); write {_bool_fix(value)} (JSON, no quotes)")
    if f.kind == "str" and not isinstance(value, str):
        raise SpecError(f"{where} is not a string ({f.what}); write {_show(f.example)}")
    if f.kind == "object" and not isinstance(value, dict):
        raise SpecError(f"{where} is not an object ({f.what}); write {{...}}{or_null}")
    if f.kind in ("int", "float"):
        too_low = f.low is not None and (value <= f.low if f.low_open else value < f.low)
        too_high = f.high is not None and (value >= f.high if f.high_open else value > f.high)
        if too_low or too_high:
            raise SpecError(f"{where} must be {_interval(f)} ({f.what})")


def _interval(f: _Field) -> str:
    if f.kind == "int":
        return f"at least {f.low:,}" if f.high is None else f"from {f.low:,} to {f.high:,}"
    return f"in {'(' if f.low_open else '['}{f.low:g}, {f.high:g}{')' if f.high_open else ']'}"


def _int_fix(value: Any, example: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    if isinstance(value, str) and 0 < len(value.strip()) <= 20 and value.strip().lstrip("+-").isdigit() \
            and value.strip().isascii():
        return f"{int(value.strip())} without quotes"
    return f"a whole number such as {_show(example)}"


def _float_fix(value: Any, example: Any) -> str:
    if isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return f"{value.strip()} without quotes"
    return f"a number such as {_show(example)}"


def _bool_fix(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on"):
        return "true"
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "0", "off"):
        return "false"
    if isinstance(value, int) and value in (0, 1):
        return "true" if value else "false"
    return "true or false"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(type(value), "null")


def _show(value: Any, depth: int = 0) -> str:
    """A JSON value for a message: as JSON writes it, bounded in length and depth, always one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity") \
            if math.isinf(value) else repr(value)
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"
    if isinstance(value, str):
        text = json.dumps(value)  # escapes newlines and control characters
        return text if len(text) <= 40 else text[:36] + '..."'
    if isinstance(value, list):
        if depth >= 2:
            return "[...]"
        items = [_show(v, depth + 1) for v in value[:3]] + (["..."] if len(value) > 3 else [])
        text = "[" + ", ".join(items) + "]"
    elif isinstance(value, dict):
        if depth >= 2:
            return "{...}"
        items = [f"{_show(k, depth + 1)}: {_show(v, depth + 1)}" for k, v in list(value.items())[:3]]
        text = "{" + ", ".join(items + (["..."] if len(value) > 3 else [])) + "}"
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:56] + " ..."


def _require(p: Path, data: dict[str, Any], key: str, allowed: Any) -> None:
    value = data.get(key, allowed)
    if value != allowed:
        raise SpecError(f"{p}: {key}: {_show(value)} is not supported by the runtime's model "
                        f"(needs {_show(allowed)})")


def _divides(p: Path, key: str, value: int, other: str, total: int, why: str) -> None:
    if total % value:
        raise SpecError(f"{p}: {key}: {value} does not divide {other}={total} ({why})")


# ------------------------------------------------------------------------------------------ mappings
def _llama(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    """llama, mistral, qwen2 and qwen3: Hugging Face's LlamaForCausalLM family of decoders."""
    family = data["model_type"]
    _check(p, data, family, _LLAMA, _LLAMA_REQUIRED)
    for key, why in _REFUSED_FLAGS[family].items():
        if data.get(key) is True:
            raise SpecError(f"{p}: {key}: true is not supported ({why}); write false")
    _require(p, data, "hidden_act", "silu")
    absent = _ABSENT[family]
    get = lambda key: data.get(key, absent[key])  # noqa: E731
    heads, h = data["num_attention_heads"], data["hidden_size"]
    if family == "qwen3" and "head_dim" in data and data["head_dim"] is None:
        raise SpecError(f"{p}: head_dim: null is not allowed (Qwen3Config needs the width of one head); "
                        f"write a value such as 128")
    head_dim = get("head_dim")
    if head_dim is None:
        _divides(p, "num_attention_heads", heads, "hidden_size", h, "each head gets hidden_size / heads channels; "
                 "or give head_dim")
    kv_heads = get("num_key_value_heads") or heads
    shown = "num_key_value_heads" + ("" if "num_key_value_heads" in data else f" (absent: {family}'s default)")
    _divides(p, shown, kv_heads, "num_attention_heads", heads,
             "each key/value head serves an equal group of query heads")
    theta, scaling = _rope(p, data)
    window = get("sliding_window") if family == "mistral" else None  # Qwen's applies only with use_sliding_window
    seq = (None if family.startswith("qwen") else data.get("sliding_window")) or get("max_position_embeddings")
    return ModelSpec(
        name=name, architecture="llama", num_layers=data["num_hidden_layers"], hidden_size=h,
        ffn_hidden_size=data["intermediate_size"], num_attention_heads=heads, num_kv_heads=kv_heads,
        vocab_size=data["vocab_size"], seq_len=min(seq, window) if window else seq,
        tie_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=float(data.get("attention_dropout", 0.0)),
        rope_theta=theta, norm_eps=float(get("rms_norm_eps")), head_dim=head_dim,
        qkv_bias=family == "qwen2", qk_norm=family == "qwen3", rope_scaling=scaling, sliding_window=window)


def _rope(p: Path, data: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, the llama3 scaling or None) as ``transformers`` 5 reads them
    (``convert_rope_params_to_dict``): the legacy ``rope_scaling`` object if given, else ``rope_parameters``;
    its ``rope_theta`` before the top-level one; its ``rope_type`` (or legacy ``type``), "default" if none."""
    key = "rope_scaling" if data.get("rope_scaling") else "rope_parameters"
    params = data.get(key) or {}
    _check(p, {f"{key}.{k}": v for k, v in params.items()}, data["model_type"],
           {f"{key}.{k}": f for k, f in _ROPE_LLAMA3.items()})
    if any(isinstance(v, dict) for v in params.values()):
        raise SpecError(f"{p}: {key}: RoPE parameters per layer type are not supported (the runtime's model "
                        "rotates every layer alike); give one flat object")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise SpecError(f"{p}: {key}.partial_rotary_factor: {_show(params['partial_rotary_factor'])} is not "
                        "supported (the runtime's RoPE rotates the whole head); write 1.0")
    theta = float(params.get("rope_theta", data.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise SpecError(f"{p}: {key}.rope_type: {_show(rope_type)} is not supported by the runtime's model "
                        "(it implements Llama 3.1's \"llama3\" scaling or none); write null for plain RoPE")
    for field in ("factor", "low_freq_factor", "high_freq_factor"):
        if field not in params:
            raise SpecError(f"{p}: {key}.{field}: missing; llama3 scaling needs it, e.g. "
                            f"\"{field}\": {_show(_ROPE_LLAMA3[field].example)}")
    if not params["low_freq_factor"] < params["high_freq_factor"]:
        raise SpecError(f"{p}: {key}.low_freq_factor: {_show(params['low_freq_factor'])} must be below "
                        f"high_freq_factor={_show(params['high_freq_factor'])} (1.0 and 4.0 in Llama 3.1)")
    original = params.get("original_max_position_embeddings",
                          data.get("max_position_embeddings", _ABSENT[data["model_type"]]["max_position_embeddings"]))
    return theta, RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                              high_freq_factor=float(params["high_freq_factor"]),
                              original_max_position_embeddings=original)


def _gpt2(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    _check(p, data, "gpt2", _GPT2)
    act = data.get("activation_function", "gelu_new")
    if act not in GPT2_GELUS:
        raise SpecError(f"{p}: activation_function: {_show(act)} is not supported by the runtime's model "
                        f"(it computes {', '.join(GPT2_GELUS)})")
    _require(p, data, "scale_attn_weights", True)
    _require(p, data, "scale_attn_by_inverse_layer_idx", False)
    _require(p, data, "add_cross_attention", False)
    h, heads = data.get("n_embd", 768), data.get("n_head", 12)
    _divides(p, "n_head", heads, "n_embd", h, "each head gets n_embd / n_head channels")
    dropout = max(float(data.get(k, 0.1)) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    positions = data.get("n_positions", 1024)
    return ModelSpec(
        name=name, architecture="gpt", num_layers=data.get("n_layer", 12), hidden_size=h,
        ffn_hidden_size=data.get("n_inner") or 4 * h, num_attention_heads=heads,
        num_kv_heads=heads, vocab_size=data.get("vocab_size", 50257),
        seq_len=positions, tie_embeddings=bool(data.get("tie_word_embeddings", True)),
        dropout=dropout, norm_eps=float(data.get("layer_norm_epsilon", 1e-5)), max_positions=positions,
        activation=None if GPT2_GELUS[act] == "gelu" else GPT2_GELUS[act])
