"""The rank -> group arithmetic, without torch.distributed."""

import itertools

import pytest

from runtime.mesh import axis_groups, coords_of, embedding_groups, rank_of


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), [(1, 1, 1, 1), (2, 2, 1, 2), (4, 1, 2, 2), (2, 4, 1, 1),
                                                    (3, 2, 2, 4), (1, 2, 4, 1)])
def test_megatron_rank_formula(pp, dp, cp, tp):
    # the plan's documented order: global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        r = t + tp * (c + cp * (d + dp * p))
        assert coords_of(r, pp, dp, cp, tp) == (p, d, c, t)
        assert rank_of(p, d, c, t, dp, cp, tp) == r


def test_groups_at_8_ranks_match_device_mesh():
    # what init_device_mesh("cpu", (2, 2, 1, 2), ("pp", "dp", "cp", "tp")) builds (runtime-notes §1)
    assert axis_groups("tp", 2, 2, 1, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert axis_groups("dp", 2, 2, 1, 2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert axis_groups("pp", 2, 2, 1, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_cp_sits_between_tp_and_dp():
    # dp2 x cp2 x tp2: a CP group is stride tp, a DP group stride tp * cp
    assert axis_groups("cp", 1, 2, 2, 2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert axis_groups("dp", 1, 2, 2, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert axis_groups("tp", 1, 2, 2, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), [(2, 2, 1, 2), (4, 1, 2, 2), (3, 2, 2, 4)])
def test_groups_partition_the_world(pp, dp, cp, tp):
    for axis in ("pp", "dp", "cp", "tp"):
        groups = axis_groups(axis, pp, dp, cp, tp)
        assert sorted(r for g in groups for r in g) == list(range(pp * dp * cp * tp))


def test_embedding_groups_pair_first_and_last_stage():
    assert embedding_groups(1, 2, 1, 2) == []
    # pp=4, dp=1, tp=2: ranks 0/1 hold stage 0, ranks 6/7 the last stage
    assert embedding_groups(4, 1, 1, 2) == [[0, 6], [1, 7]]
    # pp=2, cp=2: one pair per (dp, cp, tp) coordinate
    assert embedding_groups(2, 1, 2, 1) == [[0, 2], [1, 3]]


def test_rank_out_of_range():
    with pytest.raises(ValueError):
        coords_of(16, 2, 2, 2, 2)
