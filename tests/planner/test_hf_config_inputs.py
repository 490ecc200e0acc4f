"""A Hugging Face ``config.json`` is either planned right or refused in one line that names the key.

``autoplan plan config.json`` maps a llama, mistral, qwen2, qwen3 or gpt2 config onto a ModelSpec
(autoplan/schema/hf_config.py). Every key the mapping reads is checked before anything is derived from
it: its JSON type (``4.0``, ``"4"``, ``true`` and ``[4]`` are not a layer count), ``null`` only where
Hugging Face allows it, a finite number where a number is read, and a range (positive sizes,
probabilities in [0, 1), epsilons in (0, 1)). The file itself may be empty, binary, not JSON, a list or
nested beyond Python's recursion limit. Each mistake is exit status 2 and exactly one line on stderr:
the path, the key, what is wrong and the fix.

The table below is the catalogue of hostile configs, one row each; the fuzz after it starts from valid
llama, mistral and gpt2 configs and replaces keys by hostile values (NaN, inf, 2**70, -1, 0, 0.5, true,
null, text, [1], {}), deletes keys or adds junk. A fuzzed config is refused with a one-line SpecError or
accepted as a spec that means something (what that is is stated below without the validators' help).
100 cases in the fast lane, 1,000 in the slow one (``pytest -m slow``; ``-s`` shows the counts).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cli.main import main
from autoplan.errors import SpecError
from autoplan.schema.hf_config import is_hf_config, spec_from_hf_config

HERE = Path(__file__).parent
PLAN = ["--cluster", "cpu-local", "--global-batch-size", "8"]

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64,
         "intermediate_size": 192, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
         "attention_dropout": 0.0, "head_dim": 8, "rope_scaling": None, "torch_dtype": "float32"}
MISTRAL = json.loads((HERE / "data" / "mistral-7b-v0.1" / "config.json").read_text())
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64,
         "intermediate_size": 192, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 4096,
         "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": True, "hidden_act": "silu",
         "attention_dropout": 0.0}
QWEN3 = {**QWEN2, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 16,
         "attention_bias": False, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64, "n_head": 4,
        "n_inner": None, "vocab_size": 256, "n_positions": 128, "n_ctx": 128, "resid_pdrop": 0.1,
        "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
        "tie_word_embeddings": True}


def llama(**changes: Any) -> str:
    return json.dumps({**LLAMA, **changes})


def gpt2(**changes: Any) -> str:
    return json.dumps({**GPT2, **changes})


def qwen2(**changes: Any) -> str:
    return json.dumps({**QWEN2, **changes})


def qwen3(**changes: Any) -> str:
    return json.dumps({**QWEN3, **changes})


def without(base: dict, key: str) -> str:
    return json.dumps({k: v for k, v in base.items() if k != key})


def write(folder: Path, content: str | bytes) -> str:
    """``folder/model/config.json`` holding ``content`` (the planner names the model after the folder)."""
    path = folder / "model" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def plan(path: str, capsys) -> tuple[int, str]:
    code = main(["plan", path, *PLAN])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------------------------ hostile configs
# (what the file holds, a text the one line must contain: the key, or what is wrong with the file)
HOSTILE = {
    # the file
    "empty file": ("", "empty file"),
    "blank file": (" \n \n", "empty file"),
    "binary, not UTF-8": (b'\xff\xfe{"model_type": "llama"}\x00', "not UTF-8 text (byte 0xff at offset 0)"),
    "not JSON: a trailing comma": ('{"model_type": "llama", "hidden_size": 64,}', "not valid JSON (line 1 column"),
    "not JSON: cut short": (llama()[:40], "not valid"),  # JSON, or YAML: the CLI first looks for a profile
    "a bare JSON string": ('"model_type"', "the top level is a JSON string"),
    "a JSON list": (json.dumps([LLAMA]), "the top level is a JSON array"),
    "a JSON number": ("4", "the top level is a JSON number"),
    "a JSON null": ("null", "the top level is a JSON null"),
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "nested 100,000 deep in a config": (llama()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nest"),
    # model_type
    "model_type missing": (without(LLAMA, "model_type"), "model_type"),
    "model_type falcon": (llama(model_type="falcon"), "model_type 'falcon' has no ModelSpec mapping"),
    "model_type a list": (llama(model_type=["llama"]), "model_type"),
    # llama: a required key missing
    **{f"llama without {key}": (without(LLAMA, key), f"{key}: missing")
       for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")},
    "mistral without hidden_size": (without(MISTRAL, "hidden_size"), "hidden_size: missing"),
    # llama: integers
    "num_hidden_layers 4.0": (llama(num_hidden_layers=4.0), "num_hidden_layers: 4.0 is not an integer"),
    'num_hidden_layers "8"': (llama(num_hidden_layers="8"), "write 8 without quotes"),
    "num_hidden_layers null": (llama(num_hidden_layers=None), "num_hidden_layers: null"),
    "num_hidden_layers [1]": (llama(num_hidden_layers=[1]), "num_hidden_layers: [1]"),
    "num_hidden_layers true (a bool is not a count)": (llama(num_hidden_layers=True), "num_hidden_layers: true"),
    "num_hidden_layers 0": (llama(num_hidden_layers=0), "num_hidden_layers"),
    "num_hidden_layers 2**70": (llama(num_hidden_layers=2**70), "num_hidden_layers"),
    "num_hidden_layers 1e400 (inf)": (llama(num_hidden_layers=1).replace('"num_hidden_layers": 1',
                                                                         '"num_hidden_layers": 1e400'),
                                      "num_hidden_layers: Infinity"),
    "num_attention_heads 0": (llama(num_attention_heads=0), "num_attention_heads"),
    "hidden_size -64": (llama(hidden_size=-64), "hidden_size"),
    "hidden_size NaN": (llama(hidden_size=math.nan), "hidden_size: NaN"),
    "vocab_size 0": (llama(vocab_size=0), "vocab_size"),
    "intermediate_size {}": (llama(intermediate_size={}), "intermediate_size"),
    "hidden_size not divisible by heads": (llama(hidden_size=100, head_dim=None), "hidden_size=100"),
    "num_key_value_heads not dividing heads": (llama(num_key_value_heads=3), "num_key_value_heads"),
    "num_key_value_heads 0": (llama(num_key_value_heads=0), "num_key_value_heads"),
    "num_key_value_heads 8.0": (llama(num_key_value_heads=8.0), "num_key_value_heads"),
    "head_dim -8": (llama(head_dim=-8), "head_dim"),
    "max_position_embeddings 0": (llama(max_position_embeddings=0), "max_position_embeddings"),
    "max_position_embeddings null": (llama(max_position_embeddings=None), "max_position_embeddings"),
    "max_position_embeddings 2**70": (llama(max_position_embeddings=2**70), "max_position_embeddings"),
    "sliding_window 0.5": (llama(sliding_window=0.5), "sliding_window"),
    "sliding_window -1": (llama(sliding_window=-1), "sliding_window"),
    'sliding_window "4096"': (json.dumps({**MISTRAL, "sliding_window": "4096"}), "sliding_window"),
    # llama: numbers, flags, text
    'rope_theta "abc"': (llama(rope_theta="abc"), "rope_theta"),
    "rope_theta Infinity": (llama(rope_theta=math.inf), "rope_theta: Infinity"),
    "rope_theta 0": (llama(rope_theta=0), "rope_theta"),
    "rope_theta true": (llama(rope_theta=True), "rope_theta"),
    "rms_norm_eps NaN": (llama(rms_norm_eps=math.nan), "rms_norm_eps: NaN"),
    "rms_norm_eps 0": (llama(rms_norm_eps=0), "rms_norm_eps"),
    "rms_norm_eps -1e-5": (llama(rms_norm_eps=-1e-5), "rms_norm_eps"),
    "rms_norm_eps 1e400": (llama(rms_norm_eps=1).replace('"rms_norm_eps": 1', '"rms_norm_eps": 1e400'),
                           "rms_norm_eps"),
    "attention_dropout 1.0": (llama(attention_dropout=1.0), "attention_dropout"),
    "attention_dropout -0.1": (llama(attention_dropout=-0.1), "attention_dropout"),
    'attention_dropout "0.1"': (llama(attention_dropout="0.1"), "attention_dropout"),
    'tie_word_embeddings "yes"': (llama(tie_word_embeddings="yes"), "tie_word_embeddings"),
    "tie_word_embeddings 1": (llama(tie_word_embeddings=1), "tie_word_embeddings"),
    "attention_bias true": (llama(attention_bias=True), "attention_bias"),
    "mlp_bias null": (llama(mlp_bias=None), "mlp_bias"),
    'hidden_act "gelu"': (llama(hidden_act="gelu"), "hidden_act"),
    "hidden_act 7": (llama(hidden_act=7), "hidden_act"),
    "rope_scaling 2": (llama(rope_scaling=2), "rope_scaling"),
    # RoPE scaling: only Llama 3.1's rule; the legacy key or transformers 5's rope_parameters
    "rope_scaling yarn": (llama(rope_scaling={"rope_type": "yarn", "factor": 4.0}), 'rope_scaling.rope_type: "yarn"'),
    "rope_scaling linear (legacy type key)": (llama(rope_scaling={"type": "linear", "factor": 2.0}),
                                              'rope_scaling.rope_type: "linear"'),
    "rope_parameters dynamic": (llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
                                'rope_parameters.rope_type: "dynamic"'),
    "rope_scaling llama3 without factor": (llama(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0,
                                                               "high_freq_factor": 4.0}),
                                           "rope_scaling.factor: missing"),
    "rope_scaling llama3 factor NaN": (llama(rope_scaling={"rope_type": "llama3", "factor": math.nan,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
                                       "rope_scaling.factor: NaN"),
    "rope_scaling llama3 low >= high": (llama(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                            "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
                                        "rope_scaling.low_freq_factor"),
    "rope_parameters rope_theta 0": (llama(rope_parameters={"rope_type": "default", "rope_theta": 0}),
                                     "rope_parameters.rope_theta"),
    "rope_parameters partial rotation": (llama(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
                                         "rope_parameters.partial_rotary_factor"),
    "rope_parameters per layer type": (llama(rope_parameters={"full_attention": {"rope_type": "default"}}),
                                       "per layer type"),
    # biases the runtime's llama has no place for, sliding windows it does not run
    "attention_bias true (mistral)": (json.dumps({**MISTRAL, "attention_bias": True}), "attention_bias: true"),
    "qwen2 use_sliding_window true": (qwen2(use_sliding_window=True), "use_sliding_window: true"),
    "qwen3 use_sliding_window true": (qwen3(use_sliding_window=True), "use_sliding_window: true"),
    "qwen3 attention_bias true (biases o too)": (qwen3(attention_bias=True), "attention_bias: true"),
    "qwen3 head_dim null": (qwen3(head_dim=None), "head_dim: null"),
    "qwen2 without num_key_value_heads (32 by default)": (without(QWEN2, "num_key_value_heads"),
                                                         "num_key_value_heads (absent: qwen2's default): 32"),
    "qwen2 hidden_act gelu": (qwen2(hidden_act="gelu"), "hidden_act"),
    # gpt2 (every key has a default; each one given must be right)
    "n_layer 0": (gpt2(n_layer=0), "n_layer"),
    "n_layer 2.5": (gpt2(n_layer=2.5), "n_layer"),
    "n_layer true": (gpt2(n_layer=True), "n_layer"),
    "n_embd -64": (gpt2(n_embd=-64), "n_embd"),
    "n_embd not divisible by n_head": (gpt2(n_embd=66), "n_head"),
    "n_head 0": (gpt2(n_head=0), "n_head"),
    "n_inner -1": (gpt2(n_inner=-1), "n_inner"),
    'n_positions "1024"': (gpt2(n_positions="1024"), "n_positions"),
    "vocab_size 2**70": (gpt2(vocab_size=2**70), "vocab_size"),
    "resid_pdrop 1.5": (gpt2(resid_pdrop=1.5), "resid_pdrop"),
    "embd_pdrop -0.1": (gpt2(embd_pdrop=-0.1), "embd_pdrop"),
    "attn_pdrop NaN": (gpt2(attn_pdrop=math.nan), "attn_pdrop: NaN"),
    "layer_norm_epsilon 0": (gpt2(layer_norm_epsilon=0), "layer_norm_epsilon"),
    "layer_norm_epsilon Infinity": (gpt2(layer_norm_epsilon=math.inf), "layer_norm_epsilon"),
    'tie_word_embeddings "no" (gpt2)': (gpt2(tie_word_embeddings="no"), "tie_word_embeddings"),
    'activation_function "relu"': (gpt2(activation_function="relu"), "activation_function"),
    'activation_function "gelu_fast"': (gpt2(activation_function="gelu_fast"), "activation_function"),
    "scale_attn_by_inverse_layer_idx true": (gpt2(scale_attn_by_inverse_layer_idx=True),
                                             "scale_attn_by_inverse_layer_idx"),
    "scale_attn_weights false": (gpt2(scale_attn_weights=False), "scale_attn_weights"),
    "add_cross_attention true": (gpt2(add_cross_attention=True), "add_cross_attention"),
    # what only the ModelSpec's validate() sees: the whole model
    "10^17 parameters": (llama(num_hidden_layers=10_000, hidden_size=2**20, intermediate_size=2**22,
                               head_dim=None), "parameters"),
}


@pytest.mark.parametrize("content, must_contain", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_config_is_one_line(tmp_path, capsys, content, must_contain):
    path = write(tmp_path, content)
    code, err = plan(path, capsys)
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line, no traceback
    assert must_contain in err and path in err, err


def test_a_number_of_5000_digits_is_one_line(tmp_path):
    """Python refuses to read integers of more than 4,300 digits (a ValueError, not a JSONDecodeError)."""
    path = write(tmp_path, llama(vocab_size=1).replace('"vocab_size": 1', '"vocab_size": ' + "9" * 5000))
    with pytest.raises(SpecError, match="a number in it is too long") as err:
        spec_from_hf_config(path)
    assert "\n" not in str(err.value) and is_hf_config(path)


def test_a_number_of_5000_digits_through_the_cli(tmp_path, capsys):
    path = write(tmp_path, llama(vocab_size=1).replace('"vocab_size": 1', '"vocab_size": ' + "9" * 5000))
    code, err = plan(path, capsys)
    assert code == 2 and err.count("\n") == 1, err


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, "", b"\xff\x00", '"model_type"', "[1]",
                                     '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"],
                         ids=["deep", "empty", "binary", "string", "list", "deep in a config"])
def test_the_file_itself_is_one_line_without_the_cli(tmp_path, content):
    """spec_from_hf_config alone (the CLI's YAML look at the file refuses some of these first), and
    is_hf_config, which decides whether a path is a config, never raises: a config.json is one."""
    path = write(tmp_path, content)
    assert is_hf_config(path)
    with pytest.raises(SpecError) as err:
        spec_from_hf_config(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{path}: ")


@pytest.mark.parametrize("name", ["a" * 5000 + ".json", "nul\0.json", "missing.json", "folder.json"])
def test_is_hf_config_never_raises(tmp_path, name):
    if name == "folder.json":
        (tmp_path / name).mkdir()
    assert is_hf_config(tmp_path / name) is False


# ----------------------------------------------------------------------------------- valid configs
def test_nulls_mean_what_hugging_face_means(tmp_path, capsys):
    """null key/value heads: one per query head; null head_dim: hidden / heads; null sliding_window:
    max_position_embeddings; null n_inner: 4 x n_embd. An integer rope_theta is a number."""
    spec = spec_from_hf_config(write(tmp_path / "l", llama(num_key_value_heads=None, head_dim=None,
                                                            sliding_window=None, rope_theta=500000)))
    assert (spec.num_kv_heads, spec.head_dim, spec.seq_len, spec.rope_theta) == (8, 8, 128, 500000.0)
    spec = spec_from_hf_config(write(tmp_path / "g", gpt2()))
    assert (spec.ffn_hidden_size, spec.dropout, spec.tie_embeddings) == (256, 0.1, True)
    assert plan(write(tmp_path / "p", llama()), capsys)[0] == 0


def test_gpt2_keys_all_default(tmp_path):
    """GPT2Config has a default for every key: {"model_type": "gpt2"} is GPT-2 small."""
    spec = spec_from_hf_config(write(tmp_path, '{"model_type": "gpt2"}'))
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.vocab_size, spec.seq_len) == \
        (12, 768, 12, 50257, 1024)


def test_a_config_in_the_working_folder_is_named_after_it(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(write(tmp_path, llama())).parent)
    assert spec_from_hf_config("config.json").name == "model"


# ------------------------------------------------------------------------------------------- fuzz
BASES = {"llama": LLAMA, "mistral": MISTRAL, "qwen2": QWEN2, "qwen3": QWEN3, "gpt2": GPT2}
KEYS = {  # every key the mapping reads, present in the base or not
    "llama": sorted({*LLAMA, "sliding_window", "rope_parameters"}),
    "mistral": sorted({*MISTRAL, "head_dim", "attention_dropout", "attention_bias", "mlp_bias", "rope_scaling"}),
    "qwen2": sorted({*QWEN2, "head_dim", "rope_scaling", "rope_parameters"}),
    "qwen3": sorted({*QWEN3, "rope_scaling", "rope_parameters"}),
    "gpt2": sorted({*GPT2, "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention"}),
}
HOSTILE_VALUES = [math.nan, math.inf, -math.inf, 2**70, -(2**70), -1, 0, 1, 0.5, 4.0, 1e-300, 1e300, True, False,
                  None, "text", "8", "", "\n", [1], [], {}, {"a": [1]}]
values = st.one_of(st.sampled_from(HOSTILE_VALUES), st.integers(-10, 100_000), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.integers(), max_size=2))


@st.composite
def damaged(draw) -> tuple[str, dict, bool]:
    """A base config with 1 to 3 changes; and whether every change was junk (an unknown key)."""
    family = draw(st.sampled_from(sorted(BASES)))
    data, only_junk = dict(BASES[family]), True
    for _ in range(draw(st.integers(1, 3))):
        change = draw(st.sampled_from(["replace", "replace", "delete", "junk"]))
        if change == "junk":
            data[f"junk_{draw(st.text(max_size=6))}"] = draw(values)
            continue
        only_junk = False
        key = draw(st.sampled_from(KEYS[family]))
        if change == "delete":
            data.pop(key, None)
        else:
            data[key] = draw(values)
    return family, data, only_junk


def meaningless(spec) -> list[str]:
    """What no model can be, stated without the validators (cf. test_fuzz_inputs.meaningless_model)."""
    out = []
    for field, high in (("num_layers", 10**5), ("hidden_size", 10**7), ("ffn_hidden_size", 10**8),
                        ("num_attention_heads", 10**7), ("num_kv_heads", 10**7), ("vocab_size", 10**8),
                        ("seq_len", 10**8)):
        value = getattr(spec, field)
        if not (type(value) is int and 1 <= value < high):
            out.append(f"{field} = {value!r}")
    if not out and not (type(spec.head_dim) is int and 1 <= spec.head_dim < 10**7):
        out.append(f"head_dim = {spec.head_dim!r}")
    if not out and (spec.num_attention_heads % spec.num_kv_heads
                    or (spec.architecture == "gpt" and spec.hidden_size % spec.num_attention_heads)):
        out.append("the heads do not divide")  # llama may give head_dim apart from hidden_size / heads
    for field in ("dropout", "rope_theta", "norm_eps"):
        if not (type(getattr(spec, field)) is float and math.isfinite(getattr(spec, field))):
            out.append(f"{field} = {getattr(spec, field)!r}")
    if not out and not (0 <= spec.dropout < 1 and spec.rope_theta > 0 and 0 < spec.norm_eps < 1):
        out.append(f"dropout {spec.dropout}, rope_theta {spec.rope_theta}, norm_eps {spec.norm_eps}")
    if type(spec.tie_embeddings) is not bool or not spec.name or "\n" in spec.name:
        out.append(f"tie_embeddings {spec.tie_embeddings!r}, name {spec.name!r}")
    return out


def outcome(case: tuple[str, dict, bool]) -> str:
    """"accepted" or "refused"; anything else fails the test."""
    family, data, only_junk = case
    folder = Path(tempfile.mkdtemp(prefix="hf-fuzz-"))
    try:
        path = write(folder, json.dumps(data))  # NaN and Infinity as Python's json writes them
        assert is_hf_config(path)
        try:
            spec = spec_from_hf_config(path)
        except SpecError as err:
            assert not only_junk, f"junk keys refused: {err}"
            assert "\n" not in str(err) and str(err).startswith(f"{path}: "), repr(str(err))
            return "refused"
        assert not meaningless(spec), (meaningless(spec), data)
        spec.validate()
        if only_junk:
            assert spec == spec_from_hf_config(write(folder / "base", json.dumps(BASES[family])))
        return "accepted"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=damaged())
def test_fuzzed_config_is_refused_in_one_line_or_means_something(case):
    outcome(case)


@pytest.mark.slow
def test_fuzzed_config_slow():
    counts: Counter[str] = Counter()

    @settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=damaged())
    def run(case):
        counts[outcome(case)] += 1

    run()
    print(f"\nhf config fuzz: {sum(counts.values())} configs, {counts['accepted']} accepted, "
          f"{counts['refused']} refused")
