"""Pinned predictions: every shipped model on every shipped cluster predicts what it predicted when the file
was written (tests/planner/pinned_cases.py says how the 2,000-odd cases were chosen), to 1e-9 relative.

A refactor of the cost model must not move a single number: step time, memory per pipeline rank, every
term of the time and memory breakdowns, and the planner's choice with its step time. 1e-9 is the
float rounding of sums taken in another order; the cost tables themselves are integers (ns, bytes).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections import defaultdict

import pytest

from autoplan.schema._io import to_dict
from tests.planner.pinned_cases import DATA, MODELS, predicted_dict, setup

REL = 1e-9


def _cases() -> list[dict]:
    return json.loads(gzip.decompress(DATA.read_bytes()))["cases"]


def _by_pair() -> dict[tuple[str, str], list[dict]]:
    pairs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for case in _cases():
        pairs[(case["model"], case["cluster"])].append(case)
    return pairs


PAIRS = _by_pair()


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-15)


def _layout(d: dict):
    from autoplan.cost.estimate import layout_of
    from autoplan.cost.evaluate import StageShape
    from autoplan.cost.stage_table import Config

    config = Config(**{k: v for k, v in d.items() if k != "shapes"})
    return layout_of(config, tuple(StageShape(*s) for s in d["shapes"]))


def _workload_fn(model, cluster, training):
    from autoplan.cost.model_workload import workload_fn

    return workload_fn(model, cluster, training)


@pytest.mark.parametrize("pair", sorted(PAIRS), ids=lambda p: f"{p[0]}@{p[1]}")
def test_layouts_predict_as_pinned(pair):
    from autoplan.cost.estimate import estimate_layout

    model, cluster, base = setup(*pair)
    checked = 0
    for case in PAIRS[pair]:
        if case.get("search"):
            continue
        training = dataclasses.replace(base, **case["training"])
        predicted, _, _ = estimate_layout(_workload_fn(model, cluster, training), cluster, training,
                                          _layout(case["layout"]))
        got = predicted_dict(predicted)
        assert _close(case["predicted"], got), (case["layout"], case["training"], case["predicted"], got)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("model_name", MODELS)
def test_planner_choice_as_pinned(model_name):
    from autoplan.search.planner import search
    from autoplan.search.space import Pins

    for (name, cluster_name), cases in sorted(PAIRS.items()):
        if name != model_name:
            continue
        case = next(c for c in cases if c.get("search"))
        model, cluster, training = setup(name, cluster_name)
        result = search(model, _workload_fn(model, cluster, training), cluster, training, Pins(), time_limit_s=60)
        assert result.status == case["status"], (cluster_name, result.status)
        if result.best is None:
            assert case["step_ns"] is None
            continue
        assert result.best.step_ns == case["step_ns"], cluster_name
        assert to_dict(result.best.config) == case["config"], cluster_name
        assert [list(dataclasses.astuple(s)) for s in result.best.shapes] == case["shapes"], cluster_name
