"""Wall time of ``autoplan profile`` on meta for models that do not fit in this machine's memory.

Run: ``python benchmarks/profile_large_meta.py``. Profiles llama3-405b (bf16, micro-batch 1, seq 8192,
TP sizes 1 and 8) through the CLI entry point, and a Llama-3-70B-shaped Hugging Face config.json (built
from the config only) if transformers is installed; prints wall seconds, params and block-0 figures.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.cli.main import main  # noqa: E402
from autoplan.schema.profile import load_profile  # noqa: E402

LLAMA3_70B_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "hidden_act": "silu",
}


def run(model: str, out: Path, *extra: str) -> None:
    start = time.perf_counter()
    code = main(["profile", model, "-o", str(out), "--dtype", "bf16", "--quiet", *extra])
    wall_s = time.perf_counter() - start
    assert code == 0
    p = load_profile(out)
    block = p.blocks[0].measurements[0]
    shards = ", ".join(f"tp{s.tp}: {s.params:,} params {s.saved_activation_bytes / 2**30:.2f} GiB" for s in block.tp_shards)
    print(f"{p.name}: wall {wall_s:.1f} s; {p.total_params:,} params; {len(p.blocks)} blocks; block 0: "
          f"{block.fwd_flops / 1e12:.2f} TFLOP fwd, saved {block.saved_activation_bytes / 2**30:.2f} GiB "
          f"({p.attention_memory}); {shards}")


def main_() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run("llama3-405b", Path(tmp) / "405b.yaml", "--tp-sizes", "1,8")
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers not installed: skipping the 70B HF config")
            return
        config = Path(tmp) / "llama3-70b-hf" / "config.json"
        config.parent.mkdir()
        config.write_text(json.dumps(LLAMA3_70B_HF))
        run(str(config), Path(tmp) / "70b.yaml", "--tp-sizes", "1,8", "--seq-len", "8192")


if __name__ == "__main__":
    main_()
