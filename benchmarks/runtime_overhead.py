"""The runtime's overhead on one device: its DP=1/TP=1/PP=1 step vs a plain PyTorch loop, same model.

Both train the same GPT (4 layers, hidden 256, seq 256, batch 8, fp32) with AdamW, gradient clipping
and the same batches; the plain loop is what one would write by hand (nanoGPT-style). The runtime adds
its LR schedule, loss/peak reductions (trivial in a world of one), the memory sampling hooks and its
mesh-aware clipping. Prints the median step time of each over the timed steps and the ratio
(goal: within 5%). Usage: python benchmarks/runtime_overhead.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runtime")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from autoplan.schema import ModelSpec, ParallelDims  # noqa: E402
from rt_helpers import make_plan  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.models import build_model  # noqa: E402
from runtime.train.data import TokenSource  # noqa: E402
from runtime.trainer import Trainer  # noqa: E402

SPEC = ModelSpec(name="gpt-overhead", architecture="gpt", num_layers=4, hidden_size=256, ffn_hidden_size=1024,
                 num_attention_heads=8, num_kv_heads=8, vocab_size=256, seq_len=256)
BATCH, SEQ = 8, 256


def plain_loop(steps: int) -> list[float]:
    torch.manual_seed(0)
    model = build_model(SPEC, seq_len=SEQ)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), foreach=False)
    data = TokenSource(256, SEQ, 0)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = data.global_batch(step, BATCH)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def runtime_loop(steps: int) -> list[float]:
    plan = make_plan(SPEC, micro_batch_size=BATCH, num_microbatches=1, seq_len=SEQ, learning_rate=1e-3)
    trainer = Trainer(plan, build_mesh(ParallelDims(), torch.device("cpu"), False), TokenSource(256, SEQ, 0))
    return [trainer.step(step).step_time_s for step in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="alternate plain/runtime this many times")
    args = parser.parse_args()
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
    dist.init_process_group("gloo")
    plain, rt = [], []
    for _ in range(args.rounds):  # alternate, so machine noise hits both alike; skip 2 warm-up steps each
        plain += plain_loop(args.steps)[2:]
        rt += runtime_loop(args.steps)[2:]
    p, r = statistics.median(plain), statistics.median(rt)
    print(f"threads {torch.get_num_threads()}, {len(plain)} timed steps each")
    print(f"plain PyTorch loop : median step {p * 1e3:8.2f} ms")
    print(f"autoplan runtime   : median step {r * 1e3:8.2f} ms")
    print(f"runtime / plain    : {r / p:.3f}  ({(r / p - 1) * 100:+.1f}%)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
