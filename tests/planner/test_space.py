"""The search space: divisors from factorization, sizes refused in one line, enumeration that stays small
for the largest sizes accepted, and the parallel dimensions listed once."""

import argparse
import dataclasses
import math

import pytest

from autoplan.cli.common import add_layout_arguments
from autoplan.errors import SpecError
from autoplan.schema import TrainingSetup, load_cluster, load_model
from autoplan.schema.plan import parallel_dimensions
from autoplan.search.space import (
    MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_SEQ_LEN, Pins, check_size, divisors, group_choices, groups,
    prime_factors,
)


def test_divisors_from_factorization_match_trial_division():
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    for n in (720720, 2**20, 2**24, 3 * 5 * 7 * 11 * 13 * 17 * 19):
        factors = prime_factors(n)
        assert math.prod(p**k for p, k in factors.items()) == n
        found = divisors(n)
        assert len(found) == math.prod(k + 1 for k in factors.values()) and all(n % d == 0 for d in found)
    assert divisors(16777213) == [1, 16777213]  # a prime: sqrt(n) trial divisions, not n


def sizes(**changes):
    model = load_model("llama3-70b")
    cluster = load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=1024, seq_len=8192)
    for key, value in changes.items():
        if key == "num_layers":
            model = dataclasses.replace(model, num_layers=value)
        elif key in ("num_nodes", "devices_per_node"):
            cluster = dataclasses.replace(cluster, **{key: value})
        else:
            training = dataclasses.replace(training, **{key: value})
    return model, cluster, training


@pytest.mark.parametrize("field, value", [
    ("global_batch_size", 10**12), ("devices_per_node", 10**12), ("num_layers", 10**12), ("num_nodes", 10**12),
    ("seq_len", 10**12),
])
def test_sizes_no_cluster_has_are_refused_naming_the_field(field, value):
    with pytest.raises(SpecError) as err:
        check_size(*sizes(**{field: value}))
    message = str(err.value)
    assert message.startswith(f"{field}: ") and "\n" not in message and "at most" in message


def test_the_largest_accepted_sizes_enumerate_few_groups():
    """At every limit at once, the groups (tp, pp, dp, sp, micro-batch) stay in the thousands: each is a
    product of divisor counts, never of the sizes themselves."""
    model, cluster, training = sizes(num_nodes=MAX_DEVICES // 8, global_batch_size=MAX_GLOBAL_BATCH,
                                     seq_len=MAX_SEQ_LEN)
    model = dataclasses.replace(model, num_layers=MAX_LAYERS)
    check_size(model, cluster, training)
    found = list(groups(model, cluster, training, Pins()))
    configurations = sum(len(a) * len(b) for a, b in (group_choices(g, cluster, Pins(), MAX_LAYERS) for g in found))
    assert 100 < len(found) < 2000 and configurations < 50_000


def test_pins_and_flags_derive_from_the_parallel_dimensions():
    pinnable = [f.name for f in parallel_dimensions() if f.metadata["pinnable"]]
    assert [f.name for f in dataclasses.fields(Pins)] == [*pinnable, "recompute"]
    parser = argparse.ArgumentParser()
    add_layout_arguments(parser, required=False)
    dests = {a.dest for a in parser._actions}
    assert set(pinnable) | {"recompute"} <= dests
    assert parser.parse_args(["--offload", "--zero-stage", "2"]).offload_optimizer is True
    estimate = argparse.ArgumentParser()
    add_layout_arguments(estimate, required=True)
    needed = {a.dest for a in estimate._actions if a.required}
    assert needed == {f.name for f in parallel_dimensions() if f.metadata["estimate_needs"]}
