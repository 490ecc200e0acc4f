"""The training setup's optimizer hyper-parameters: written into every plan with their defaults, read
back exactly, and refused with a one-line error naming the field when out of range."""

from __future__ import annotations

import pytest

from autoplan.errors import SpecError
from autoplan.schema import dump_plan, load_plan
from autoplan.cli.main import main


@pytest.fixture
def plan_text(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--optimizer", "sgd",
                 "-o", str(path), "--json"]) == 0
    capsys.readouterr()
    return path.read_text()


def test_plan_carries_the_optimizer_and_its_hyper_parameters(plan_text, tmp_path):
    for line in ("optimizer: sgd", "adam_betas: [0.9, 0.95]", "adam_eps: 1.0e-08", "sgd_momentum: 0.9"):
        assert line in plan_text
    path = tmp_path / "edited.yaml"
    path.write_text(plan_text.replace("sgd_momentum: 0.9", "sgd_momentum: 0.5"))
    plan = load_plan(path)
    assert (plan.training.optimizer, plan.training.sgd_momentum, plan.training.adam_betas) == ("sgd", 0.5, (0.9, 0.95))
    again = tmp_path / "again.yaml"
    again.write_text(dump_plan(plan))
    assert load_plan(again) == plan


@pytest.mark.parametrize(("old", "new", "field"), [
    ("adam_betas: [0.9, 0.95]", "adam_betas: [0.9, 1.5]", "adam_betas"),
    ("adam_eps: 1.0e-08", "adam_eps: 0", "adam_eps"),
    ("sgd_momentum: 0.9", "sgd_momentum: -0.1", "sgd_momentum"),
])
def test_out_of_range_hyper_parameters_are_refused(plan_text, tmp_path, old, new, field):
    path = tmp_path / "bad.yaml"
    path.write_text(plan_text.replace(old, new))
    with pytest.raises(SpecError) as err:
        load_plan(path)
    assert field in str(err.value) and "\n" not in str(err.value)
