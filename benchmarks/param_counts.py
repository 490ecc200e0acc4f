"""Parameter counts that must agree: the module ``autoplan run`` builds, the profile, the spec's formula
and the dry run's expected count, for every shipped model and every Hugging Face family the runtime builds.

    python benchmarks/param_counts.py [--json]

Columns (all counting a tied embedding once, at the spec's sequence length), first the model itself:
* ``built``: the runtime's module for the spec (runtime.models.build_model on meta);
* ``spec``: ``ModelSpec.total_params()``, the planner's formula;
* ``profile``: ``autoplan profile``'s traced total (on meta): for a shipped model the runtime's module,
  for a Hugging Face family the ``transformers`` module built from its config.json;
* ``transformers``: the ``transformers`` model's parameters (families only);
then with the vocabulary padded as a one-device plan pads it (Megatron's rule; the padding rows are zeros
the loss never targets, runtime/models/common.py):
* ``built, padded vocabulary``: the module ``autoplan run`` trains for a one-device plan;
* ``dry run``: the cost model's ``local_params_per_rank`` for that plan, what ``autoplan run --dry-run``
  prints as ``expected_local_params``.
Exit status 1 if any row disagrees.

Mixture-of-Experts models (issue 31: shipped mixtral-8x7b, qwen3-*-a*b, deepseek-v3, moe-tiny, and the
mixtral, qwen2_moe, qwen3_moe and deepseek_v3 families) get the ``spec`` column (and ``transformers`` for a
family) only, the others "-": the profiler and the runtime's module do not describe them through the spec
yet, and the cost model refuses them (``ModelSpec.unpriced``), so there is no dry run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, vocab_size=300,
            max_position_embeddings=256)
FAMILIES = {
    "llama-3.1 (rope_scaling)": ("LlamaConfig", dict(TINY, num_key_value_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, rope_theta=500000.0)),
    "mistral": ("MistralConfig", dict(TINY, num_key_value_heads=2, sliding_window=256)),
    "qwen2 (q/k/v bias)": ("Qwen2Config", dict(TINY, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3 (q/k norm, head_dim 32)": ("Qwen3Config", dict(TINY, num_key_value_heads=2, head_dim=32)),
    "gpt2 (n_positions 256)": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=256)),
    "mixtral (MoE)": ("MixtralConfig", dict(TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe (shared expert, leading dense block)": ("Qwen2MoeConfig", dict(
        TINY, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[0])),
    "qwen3_moe (MoE, head_dim 32)": ("Qwen3MoeConfig", dict(TINY, num_key_value_heads=2, head_dim=32, num_experts=4,
                                                            num_experts_per_tok=2, moe_intermediate_size=32)),
    # transformers builds no multi-token-prediction module: compared without one
    "deepseek_v3 (MLA, MoE, no MTP)": ("DeepseekV3Config", dict(
        TINY, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_group=2, topk_group=1, num_mtp_layers=0)),
}


UNPADDED = ("built", "spec", "profile", "transformers")
"""Counts of the model itself, which must be equal."""
PADDED = ("built, padded vocabulary", "dry run")
"""Counts with the plan's padded vocabulary (Megatron's rule, tp 1), which must be equal."""


def unique_params(module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() yields a tied tensor once


def counts(spec, profile_arg: str) -> dict:
    if spec.moe is not None or spec.mla is not None:  # MoE / MLA: the spec's count only (module docstring)
        return {"spec": spec.total_params()}
    from autoplan.cost.local_params import local_params_per_rank
    from autoplan.profiler.model_profile import ProfileOptions, profile_model
    from autoplan.schema import Layout, Stage, TrainingSetup
    from runtime.models import build_model, build_stage_model

    training = TrainingSetup(global_batch_size=1, seq_len=spec.seq_len)
    layout = Layout(tp=1, pp=1, dp=1, sequence_parallel=False, zero_stage=0, offload_optimizer=False,
                    schedule="1f1b", virtual_stages=1, micro_batch_size=1, num_microbatches=1,
                    stages=(Stage(index=0, rank=0, layers=(0, spec.num_layers)),))
    profile = profile_model(profile_arg, ProfileOptions(seq_len=training.seq_len, tp_sizes=(1,), progress=False))
    as_run = build_stage_model(spec, training.seq_len, None, True, True, device="meta",
                               vocab_rows=spec.padded_vocab_size(1))
    return {"built": unique_params(build_model(spec, device="meta", seq_len=training.seq_len)),
            "spec": spec.total_params(),
            "profile": profile.total_params,
            "built, padded vocabulary": unique_params(as_run),
            "dry run": sum(local_params_per_rank(spec, layout, training))}


def family_rows(folder: Path) -> list[dict]:
    import torch
    import transformers

    from autoplan.schema.hf_config import spec_from_hf_config

    rows = []
    for label, (cls, kwargs) in FAMILIES.items():
        config = getattr(transformers, cls)(**kwargs)
        out = folder / label.split()[0]
        config.save_pretrained(out)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(config)
        spec = spec_from_hf_config(out / "config.json")
        rows.append({"model": label, **counts(spec, str(out / "config.json")), "transformers": unique_params(hf)})
    return rows


def shipped_rows() -> list[dict]:
    from autoplan.schema import load_model
    from autoplan.schema.io import shipped_names

    return [{"model": name, **counts(load_model(name), name)} for name in shipped_names("models")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = shipped_rows() + family_rows(Path(tmp))
    for row in rows:
        row["agree"] = (len({row[k] for k in UNPADDED if k in row}) == 1
                        and row.get("built, padded vocabulary") == row.get("dry run"))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        cols = [*UNPADDED, *PADDED]
        print(f"| model | {' | '.join(cols)} | agree |")
        print("|---|" + "---:|" * len(cols) + "---|")
        for r in rows:
            cells = [f"{r[c]:,}" if c in r else "-" for c in cols]
            print(f"| {r['model']} | {' | '.join(cells)} | {'yes' if r['agree'] else 'NO'} |")
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
