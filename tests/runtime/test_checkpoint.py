"""Checkpoint/resume: saving at step 10, stopping and resuming gives steps 11-20 bitwise equal to an
uninterrupted run (CPU fp32: the same kernels on the same inputs in the same order are deterministic);
and a save that did not finish is never taken for a checkpoint."""

from __future__ import annotations

import pytest

from rt_cases import RESUME, RESUME_AT, RESUME_STEPS
from rt_launcher import matrix_results
from runtime.train.checkpoint import latest

PARAMS = [pytest.param(world, name, id=name) for world, cases in RESUME.items() for name in cases]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_resume_is_bitwise_identical(world, name):
    got = matrix_results(world)[name]
    assert len(got["straight"]) == RESUME_STEPS and len(got["resumed"]) == RESUME_STEPS - RESUME_AT
    assert got["resumed"] == got["straight"][RESUME_AT:]


def test_latest_ignores_unfinished_saves(tmp_path):
    (tmp_path / "step_10").mkdir()
    (tmp_path / "step_10" / "COMPLETE").write_text("10\n")
    (tmp_path / "step_20.tmp").mkdir()  # a crash mid-save: never renamed
    (tmp_path / "step_30").mkdir()  # no COMPLETE marker
    assert latest(str(tmp_path)).name == "step_10"
    assert latest(str(tmp_path / "missing")) is None
