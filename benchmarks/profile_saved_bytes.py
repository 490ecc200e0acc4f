"""What PyTorch really keeps for backward in one GPT and one Llama block, term by term, in units of s*b*h
bytes, against the Korthikanti-style count of ``autoplan.cost.activations.block_saved_bytes``.

Run: ``python benchmarks/profile_saved_bytes.py [--device cuda]``. Every configuration runs one real block under
the profiler's tracer (saved_tensors_hooks, deduplicated by storage, parameters excluded), so the terms
are what the real kernels save: flash = CPU flash SDPA (the default backend), math = SDPA forced to the
math backend (``sdpa_kernel(SDPBackend.MATH)``). Shapes: s=256, b=2, h=256, 8 heads, f=4h (GPT) or
f=688 (Llama SwiGLU), Llama with 4 KV heads.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.cost.activations import block_saved_bytes  # noqa: E402
from autoplan.profiler.timing import materialize  # noqa: E402
from autoplan.profiler.trace import trace_forward  # noqa: E402
from autoplan.cost.workload import LayerSplit  # noqa: E402
from autoplan.schema import ModelSpec, TrainingSetup  # noqa: E402
from runtime.models import build_model  # noqa: E402

S, B, H, HEADS = 256, 2, 256, 8


def spec(arch: str, dropout: float) -> ModelSpec:
    llama = arch == "llama"
    return ModelSpec(name=arch, architecture=arch, num_layers=2, hidden_size=H, ffn_hidden_size=688 if llama else 4 * H,
                     num_attention_heads=HEADS, num_kv_heads=4 if llama else HEADS, vocab_size=256, seq_len=S,
                     dropout=dropout)


DEVICE = torch.device("cuda" if "--device" in sys.argv and sys.argv[-1] == "cuda" else "cpu")


def measure(arch: str, dtype: torch.dtype, attention: str, dropout: float) -> tuple[list[tuple[str, float]], float]:
    """Each saved tensor (module, saving op, shape, dtype) in units of s*b*h bytes, and the total."""
    torch.manual_seed(0)
    model = build_model(spec(arch, dropout), device="meta", seq_len=S)
    block = materialize(model.blocks["0"], DEVICE).to(dtype).train()
    x = torch.randn(B, S, H, dtype=dtype, device=DEVICE, requires_grad=True)
    backend = sdpa_kernel(SDPBackend.MATH) if attention == "math" else contextlib.nullcontext()
    with backend:
        trace, _ = trace_forward(block, [("block", block)], lambda: block(x))
    terms = [(f"{saved.module or 'block':<10} {saved.op.replace('aten.', ''):<58} {str(list(saved.shape)):<18} "
              f"{saved.dtype}", saved.nbytes / (S * B * H)) for saved in trace.saved]
    return terms, trace.saved_bytes("block") / (S * B * H)


def analytic(arch: str, dtype: torch.dtype, attention: str, dropout: float) -> float:
    s = spec(arch, dropout)
    precision = "fp32" if dtype == torch.float32 else "bf16"
    training = TrainingSetup(B, S, precision=precision, attention="flash" if attention == "flash" else "standard")
    saved = block_saved_bytes(s, LayerSplit(B), training)
    return saved.none / (S * B * H)


def main() -> None:
    for arch in ("gpt", "llama"):
        for dtype in (torch.float32, torch.bfloat16):
            for attention in ("flash", "math"):
                for dropout in (0.0, 0.1):
                    terms, total = measure(arch, dtype, attention, dropout)
                    model = analytic(arch, dtype, attention, dropout)
                    name = str(dtype).replace("torch.", "")
                    print(f"\n== {arch} {name} {attention} dropout={dropout}: measured {total:.3f} sbh bytes, "
                          f"cost model {model:.3f} (diff {total - model:+.3f})")
                    for key, value in terms:
                        print(f"   {value:8.4f}  {key}")


if __name__ == "__main__":
    main()
