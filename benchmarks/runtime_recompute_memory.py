"""Activation recomputation lowers peak memory: one process per setting, the runtime's own measure.

A GPT big enough for activations to dominate (8 layers, hidden 512, seq 512, batch 8, fp32, CPU) runs
two optimizer steps through the runtime (world of 1) with no recomputation, selective recomputation
(attention core) on every block, full recomputation on every 2nd block and on every block. Printed per
setting: the peak heap the runtime reports (glibc mallinfo2, sampled at each block's forward end: see
runtime/device.py), the same less the heap before the step (= activations + gradients + temporaries),
and the bytes autograd saves for backward (saved_tensors_hooks, deduplicated by storage) in one forward.

On CPU, SDPA already keeps no T x T score matrix (flash-style kernel), so selective recomputation saves
little here; on GPUs without a fused kernel it saves the s^2 term (Korthikanti et al. 2022).
Usage: python benchmarks/runtime_recompute_memory.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runtime")]

SETTINGS = {
    "none": {},
    "selective_all": {"selective": tuple(range(8))},
    "full_every_2nd": {"full": (0, 2, 4, 6)},
    "full_all": {"full": tuple(range(8))},
}


def spec():
    from autoplan.schema import ModelSpec
    return ModelSpec(name="gpt-bench", architecture="gpt", num_layers=8, hidden_size=512, ffn_hidden_size=2048,
                     num_attention_heads=8, num_kv_heads=8, vocab_size=256, seq_len=512)


def saved_bytes(model, x) -> int:
    """Bytes autograd keeps for backward in one forward, parameters excluded, each storage once."""
    import torch
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s._cdata not in params:
            seen[s._cdata] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).float().sum().backward()
    return sum(seen.values())


def measure(name: str) -> dict:
    import torch
    import torch.distributed as dist

    from autoplan.schema import ParallelDims
    from rt_helpers import make_plan
    from runtime.device import heap_in_use_bytes
    from runtime.mesh import build_mesh
    from runtime.train.data import TokenSource
    from runtime.trainer import Trainer

    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo")
    plan = make_plan(spec(), micro_batch_size=8, num_microbatches=1, seq_len=512, **SETTINGS[name])
    trainer = Trainer(plan, build_mesh(ParallelDims(), torch.device("cpu"), False), TokenSource(256, 512, 0))
    trainer.step(0)  # allocates gradients and Adam state: the second step shows the steady state
    before = heap_in_use_bytes()
    peak = trainer.step(1).peak_bytes
    x = TokenSource(256, 512, 0).global_batch(0, 8)[0]
    saved = saved_bytes(trainer.parts.models[0], x)
    dist.destroy_process_group()
    return {"setting": name, "peak_gib": peak / 2**30, "peak_over_start_gib": (peak - before) / 2**30,
            "saved_for_backward_gib": saved / 2**30}


def main() -> None:
    if len(sys.argv) == 2:  # child: one setting per process, so allocator state does not carry over
        print(json.dumps(measure(sys.argv[1])))
        return
    print(f"{'setting':<16}{'peak GiB':>10}{'peak-start GiB':>16}{'saved for bwd GiB':>19}")
    for name in SETTINGS:
        out = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<16}{r['peak_gib']:>10.3f}{r['peak_over_start_gib']:>16.3f}{r['saved_for_backward_gib']:>19.3f}",
              flush=True)


if __name__ == "__main__":
    main()
