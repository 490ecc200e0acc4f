"""Resume across layouts: 10 steps of gpt-tiny (tied embedding) under dp4 ZeRO-3 with a checkpoint at
step 10, then steps 11-15 resumed from it under tp2 pp2 1f1b (4 ranks: the tied head becomes a copy on
the last stage), pp2 interleaved (2 ranks, two stage modules per rank) and dp2 ZeRO-1 (2 ranks), each
into a fresh trainer whose weights are first halved (so only the checkpoint can make it match).

Compared with the uninterrupted dp4 ZeRO-3 run of 15 steps and with the serial run: max relative loss
difference <= 1e-5 (another layout sums in another order: fp32 rounding only, see test_matrix.py).
Two launches: 4 ranks (save, the uninterrupted run, the tp2 pp2 resume), then 2 ranks.

Across padded vocabularies: gpt-tiny with a 300-token vocabulary is padded to 384 rows under dp4
(128 x tp1) and to 512 under tp2 (128 x tp2); saved under dp4 ZeRO-3, resumed under tp2 pp2 and tp2,
it must continue as the serial unpadded run does (the checkpoint's real rows, its optimizer state too).
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import pytest

from autoplan.schema import dump_plan, load_model
from rt_helpers import make_plan, serial_run
from rt_launcher import job_results

pytestmark = pytest.mark.slow

SAVE_AT, STEPS = 10, 15
BASE = dict(dp=4, zero=3, micro_batch_size=2, num_microbatches=1)  # global batch 8
LAYOUTS = {  # name -> (world, make_plan arguments), all with the global batch of 8
    "tp2 pp2 1f1b": (4, dict(tp=2, pp=2, schedule="1f1b", micro_batch_size=2, num_microbatches=4)),
    "pp2 interleaved": (2, dict(pp=2, schedule="interleaved", virtual_stages=2, micro_batch_size=2,
                                num_microbatches=4)),
    "dp2 zero1": (2, dict(dp=2, zero=1, micro_batch_size=2, num_microbatches=2)),
}


VOCAB = 300  # padded to 384 at tp1, 512 at tp2
PADDED_LAYOUTS = {"v300 tp2 pp2 1f1b": (4, LAYOUTS["tp2 pp2 1f1b"][1]), "v300 tp2": (2, dict(tp=2, micro_batch_size=2,
                                                                                          num_microbatches=4))}


def odd_vocab(kw: dict) -> dict:
    return {**kw, "model": dataclasses.replace(load_model("gpt-tiny"), vocab_size=VOCAB)}


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@functools.lru_cache(maxsize=None)
def runs() -> dict:
    folder = Path(tempfile.mkdtemp(prefix="autoplan-resume-"))
    ckpt = str(folder / "ckpt")

    def plan_file(name: str, kw: dict) -> str:
        path = folder / f"{name.replace(' ', '_')}.yaml"
        path.write_text(dump_plan(make_plan(**kw)))
        return str(path)

    base = plan_file("dp4 zero3", BASE)
    jobs4 = [{"name": "saved", "plan": base, "steps": SAVE_AT, "checkpoint_dir": ckpt, "save_every": SAVE_AT},
             {"name": "uninterrupted", "plan": base, "steps": STEPS}]
    jobs2 = []
    for name, (world, kw) in LAYOUTS.items():
        job = {"name": name, "plan": plan_file(name, kw), "steps": STEPS, "checkpoint_dir": ckpt, "resume": True}
        (jobs4 if world == 4 else jobs2).append(job)
    odd_ckpt = str(folder / "ckpt_v300")
    odd_base = plan_file("v300 dp4 zero3", odd_vocab(BASE))
    jobs4 += [{"name": "v300 saved", "plan": odd_base, "steps": SAVE_AT, "checkpoint_dir": odd_ckpt,
               "save_every": SAVE_AT}]
    for name, (world, kw) in PADDED_LAYOUTS.items():
        job = {"name": name, "plan": plan_file(name, odd_vocab(kw)), "steps": STEPS, "checkpoint_dir": odd_ckpt,
               "resume": True}
        (jobs4 if world == 4 else jobs2).append(job)
    got = job_results(4, jobs4, folder)  # the save comes first: the 2-rank launch needs the checkpoint
    got |= job_results(2, jobs2, folder)
    return got


def test_saved_run_is_the_uninterrupted_one():
    got = runs()
    assert got["saved"]["losses"] == got["uninterrupted"]["losses"][:SAVE_AT]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_into_another_layout(name):
    got = runs()
    resumed, straight = got[name]["losses"], got["uninterrupted"]["losses"][SAVE_AT:]
    serial = serial_run(make_plan(**BASE), STEPS)[0][SAVE_AT:]
    assert len(resumed) == STEPS - SAVE_AT
    vs_straight, vs_serial = max_rel_diff(resumed, straight), max_rel_diff(resumed, serial)
    print(f"dp4 zero3 -> {name}: steps 11-15 max rel diff {vs_straight:.2e} vs the uninterrupted dp4 zero3 run, "
          f"{vs_serial:.2e} vs serial")
    assert vs_straight <= 1e-5, (resumed, straight)
    assert vs_serial <= 1e-5, (resumed, serial)


@pytest.mark.parametrize("name", list(PADDED_LAYOUTS))
def test_resume_across_padded_vocabulary_sizes(name):
    got = runs()
    resumed = got[name]["losses"]
    serial = serial_run(make_plan(**odd_vocab(BASE)), STEPS)[0][SAVE_AT:]
    assert make_plan(**odd_vocab(BASE)).padded_vocab_size == 384
    assert make_plan(**odd_vocab(PADDED_LAYOUTS[name][1])).padded_vocab_size == 512
    assert len(resumed) == STEPS - SAVE_AT
    vs_serial = max_rel_diff(resumed, serial)
    print(f"v300 dp4 zero3 (384 rows) -> {name} (512 rows): steps 11-15 max rel diff {vs_serial:.2e} vs serial")
    assert vs_serial <= 1e-5, (resumed, serial)
