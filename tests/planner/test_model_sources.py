"""Every way to name a model plans through the same cost model: a spec, a Hugging Face config.json that maps
onto one, and a profile from ``autoplan profile`` (at any precision and TP size, without re-profiling);
vocabularies that TP does not divide are padded as Megatron-LM pads them."""

import json
from pathlib import Path

import pytest

from autoplan.cli.main import main
from autoplan.schema import load_model, load_plan
from autoplan.schema.hf_config import spec_from_hf_config

HERE = Path(__file__).parent
MISTRAL_CONFIG = str(HERE / "data" / "mistral-7b-v0.1" / "config.json")  # Mistral-7B-v0.1's public config
HF_LLAMA_TINY = str(HERE.parent / "profiler" / "hf_llama_tiny" / "config.json")
LAYOUT = ["--tp", "2", "--pp", "1", "--zero-stage", "1", "--schedule", "1f1b", "--micro-batch-size", "1"]


def estimate(capsys, model: str, *extra: str) -> dict:
    assert main(["estimate", model, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["predicted"]


def test_mistral_config_maps_onto_the_shipped_spec():
    """The config is the shipped spec and its 4096-token window (the shipped file leaves the window out, so
    its plans and fingerprints stay as they were; at its seq_len of 4096 the attention is the same)."""
    spec, shipped = spec_from_hf_config(MISTRAL_CONFIG), load_model("mistral-7b")
    assert spec == type(spec)(**{**vars(shipped), "name": spec.name, "sliding_window": 4096})


def test_mistral_config_and_spec_predict_the_same(capsys):
    args = ["--cluster", "dgx-h100-80gb", "--global-batch-size", "64", *LAYOUT]
    from_config, from_spec = estimate(capsys, MISTRAL_CONFIG, *args), estimate(capsys, "mistral-7b", *args)
    assert from_config["step_time_s"] == pytest.approx(from_spec["step_time_s"], rel=0.01)
    assert from_config["peak_memory_gib"] == pytest.approx(from_spec["peak_memory_gib"], rel=0.01)


def test_unmappable_config_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "falcon", "hidden_size": 64}))
    assert main(["estimate", str(config), "--cluster", "cpu-local", "--global-batch-size", "8", *LAYOUT]) == 2
    err = capsys.readouterr().err.strip()
    assert "model_type 'falcon' has no ModelSpec mapping" in err and len(err.splitlines()) == 1


def test_gpt2_vocabulary_plans_with_tp8(tmp_path, capsys):
    """50,257 tokens: no TP size > 1 divides it; padded to 51,200 (= 128 x 8 x 50) the plan is written."""
    out = tmp_path / "plan.yaml"
    assert main(["plan", "gpt2-medium", "--cluster", "dgx-a100-80gb", "--global-batch-size", "16", "--tp", "8",
                 "--pp", "1", "--zero-stage", "0", "--schedule", "1f1b", "--json", "-o", str(out)]) == 0
    plan = load_plan(out)
    assert plan.tp == 8 and plan.model.vocab_size == 50257 and plan.padded_vocab_size == 51200
    assert "padded_vocab_size: 51200" in out.read_text()
    assert load_model("gpt2-medium").padded_vocab_size(1) == 50304


def test_wrong_padded_vocab_in_a_plan_is_refused(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["estimate", "gpt2-medium", "--cluster", "dgx-a100-80gb", "--global-batch-size", "8", "--tp", "8",
                 "--pp", "1", "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "1", "--json",
                 "-o", str(out)]) == 0
    out.write_text(out.read_text().replace("padded_vocab_size: 51200", "padded_vocab_size: 50257"))
    with pytest.raises(Exception, match="padded_vocab_size: 50257 differs from 51200"):
        load_plan(out)


@pytest.fixture(scope="module")
def llama_2layer_profile(tmp_path_factory):
    """A 2-layer Llama-3-8B-wide model profiled once, on meta, in fp32, at TP 1 and 2."""
    folder = tmp_path_factory.mktemp("profile")
    spec = folder / "llama-2l.yaml"
    spec.write_text("name: llama-2l\narchitecture: llama\nnum_layers: 2\nhidden_size: 4096\nffn_hidden_size: 14336\n"
                    "num_attention_heads: 32\nnum_kv_heads: 8\nvocab_size: 32000\nseq_len: 4096\n")
    out = folder / "profile.yaml"
    assert main(["profile", str(spec), "-o", str(out), "--tp-sizes", "1,2", "--quiet"]) == 0
    return str(out), str(spec)


def test_one_profile_plans_at_bf16_and_fp8(llama_2layer_profile, capsys):
    """fp32 profile, bf16 and fp8 plans: the GEMMs run faster in fp8; activations are bf16 in both, half the
    fp32 plan's block bytes; the analytic spec of the same model predicts the same to within the kernels'
    differences (the traced eager model moves and keeps more than Megatron's fused kernels)."""
    profile, spec = llama_2layer_profile
    args = ["--cluster", "dgx-h100-80gb", "--global-batch-size", "8", *LAYOUT]
    fp32, bf16, fp8 = (estimate(capsys, profile, *args, "--precision", p) for p in ("fp32", "bf16", "fp8"))
    assert fp8["step_time_s"] < bf16["step_time_s"] < fp32["step_time_s"]
    assert fp8["memory"]["activations_gib"] == pytest.approx(bf16["memory"]["activations_gib"])
    blocks = {p: workload(profile, p).block for p in ("fp32", "bf16", "fp8")}
    assert blocks["bf16"].saved_bytes == blocks["fp8"].saved_bytes == blocks["fp32"].saved_bytes / 2
    assert blocks["bf16"].fwd_flops == blocks["fp8"].fwd_flops == blocks["fp32"].fwd_flops
    analytic = estimate(capsys, spec, *args, "--precision", "bf16")
    assert bf16["step_time_s"] == pytest.approx(analytic["step_time_s"], rel=0.10)


def workload(profile_path: str, precision: str):
    from autoplan.cost.model_workload import workload_fn
    from autoplan.cost.workload import LayerSplit
    from autoplan.schema import TrainingSetup, load_cluster
    from autoplan.schema.profile import load_profile

    training = TrainingSetup(global_batch_size=8, seq_len=4096, precision=precision)
    return workload_fn(load_profile(profile_path), load_cluster("dgx-h100-80gb"), training)(LayerSplit(1, 2, False))


def test_profile_plans_at_an_unprofiled_tp(llama_2layer_profile, capsys):
    """Profiled at TP 1 and 2; TP 4 from the replicated + split/t decomposition gives the analytic FLOPs."""
    profile, spec = llama_2layer_profile
    args = ["--cluster", "dgx-h100-80gb", "--global-batch-size", "8", "--tp", "4", "--pp", "1", "--zero-stage", "1",
            "--schedule", "1f1b", "--micro-batch-size", "1"]
    assert estimate(capsys, profile, *args)["tflops_per_gpu"] == pytest.approx(
        estimate(capsys, spec, *args)["tflops_per_gpu"], rel=0.10)


def test_fp8_on_a100_is_refused(llama_2layer_profile, capsys):
    profile, _ = llama_2layer_profile
    assert main(["estimate", profile, "--cluster", "dgx-a100-80gb", "--global-batch-size", "8", *LAYOUT,
                 "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--precision fp8: a100-sxm-80gb has no fp8 tensor cores" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_plan_of_an_hf_profile_writes_a_runnable_plan(tmp_path, capsys):
    """A profile of a Hugging Face llama config: the plan embeds the spec the config maps onto."""
    pytest.importorskip("transformers")
    profile, out = tmp_path / "profile.yaml", tmp_path / "plan.yaml"
    assert main(["profile", HF_LLAMA_TINY, "-o", str(profile), "--tp-sizes", "1,2", "--quiet"]) == 0
    assert main(["plan", str(profile), "--cluster", "cpu-local", "--global-batch-size", "8", "--json",
                 "-o", str(out)]) == 0
    assert load_plan(out).model == spec_from_hf_config(HF_LLAMA_TINY, name=load_plan(out).model.name)
