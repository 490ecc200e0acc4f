"""The parallel layouts train exactly like one process: each plan of rt_cases.CASES runs for 5 steps on
gloo ranks and its losses and gradient norms are compared with a serial run of the same model, seed and
global batches (rt_helpers.serial_run, plain PyTorch). One torchrun launch per world size.

Tolerance: max relative difference <= 1e-5 in fp32. A sharded run sums the same products in another
order (TP splits the matmul reductions, DP/PP average micro-batch means), which moves fp32 results by a
few ulps (~1e-7 relative per op); over 5 AdamW steps that stays ~1e-6 (runtime-notes: dl <= 1e-6). A
real bug -- a missing or doubled gradient reduction, a wrong stage boundary, an untied embedding -- moves
the loss by > 1e-5 within a step or two at this learning rate (1e-2), and the gradient norm at once.
"""

from __future__ import annotations

import pytest

from rt_cases import CASES, STEPS
from rt_helpers import make_plan, serial_run
from rt_launcher import matrix_results

pytestmark = pytest.mark.slow

PARAMS = [pytest.param(world, name, id=name) for world, cases in CASES.items() for name in cases]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_matches_serial(world, name):
    got = matrix_results(world)[name]
    losses, norms = serial_run(make_plan(**CASES[world][name]), STEPS)
    loss_diff = max_rel_diff(got["losses"], losses)
    norm_diff = max_rel_diff(got["grad_norms"], norms)
    print(f"{name}: max rel diff loss {loss_diff:.2e}, grad norm {norm_diff:.2e}")
    assert len(got["losses"]) == STEPS
    assert loss_diff <= 1e-5, (got["losses"], losses)
    assert norm_diff <= 1e-5, (got["grad_norms"], norms)
