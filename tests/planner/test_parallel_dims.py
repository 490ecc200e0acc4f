"""ParallelDims: the one place of rank order, groups, strides and nodes, checked without torch.distributed.

The cost model prices each group on the links its ``span`` crosses and the runtime builds its DeviceMesh
from the same object, so these properties are what keeps prediction and execution on the same groups.
"""

import itertools
import subprocess
import sys

import pytest

from autoplan.schema import ParallelDims
from autoplan.schema.parallel_dims import AXES, GROUPS, GroupSpan

SHAPES = [(1, 1, 1, 1), (2, 2, 1, 2), (4, 1, 2, 2), (2, 4, 1, 1), (3, 2, 2, 4), (1, 2, 4, 1)]


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), SHAPES)
def test_megatron_rank_formula(pp, dp, cp, tp):
    # the plan's documented order: global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
    dims = ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp)
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        r = t + tp * (c + cp * (d + dp * p))
        assert dims.coords(r) == (p, d, c, t)
        assert dims.rank(pp=p, dp=d, cp=c, tp=t) == r
    assert dims.world_size == pp * dp * cp * tp and dims.mesh_shape == (pp, dp, cp, tp)


def test_groups_at_8_ranks_match_device_mesh():
    # what init_device_mesh("cpu", (2, 2, 1, 2), ("pp", "dp", "cp", "tp")) builds (runtime-notes section 1)
    dims = ParallelDims(pp=2, dp=2, cp=1, tp=2)
    assert dims.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_cp_sits_between_tp_and_dp():
    # dp2 x cp2 x tp2: a CP group is stride tp, a DP group stride tp * cp, and dp x cp together stride tp
    dims = ParallelDims(pp=1, dp=2, cp=2, tp=2)
    assert dims.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.groups("dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), SHAPES)
def test_every_group_partitions_the_world_and_is_the_span_it_is_priced_as(pp, dp, cp, tp):
    """Each kind of group covers every rank once, and each group is ``size`` ranks ``stride`` apart, the
    span comm.group_link prices; ``group_of`` finds a rank's own group."""
    dims = ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp)
    for name in GROUPS:
        groups = dims.groups(name)
        assert sorted(r for g in groups for r in g) == list(range(dims.world_size)), name
        span = dims.span(name)
        for g in groups:
            assert len(g) == span.size, name
            assert all(b - a == span.stride for a, b in zip(g, g[1:])), (name, g, span)
            for r in g:
                assert dims.group_of(r, name) == g
    assert dims.span("dp_cp").size == dp * cp and dims.stage_ranks == tp * cp * dp


@pytest.mark.parametrize(("pp", "dp", "cp", "tp"), SHAPES)
def test_strides_are_the_products_of_the_faster_axes(pp, dp, cp, tp):
    dims = ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp)
    assert [dims.stride(a) for a in AXES] == [dp * cp * tp, cp * tp, tp, 1]


def test_embedding_groups_pair_first_and_last_stage():
    assert ParallelDims(pp=1, dp=2, cp=1, tp=2).embedding_groups() == []
    # pp=4, dp=1, tp=2: ranks 0/1 hold stage 0, ranks 6/7 the last stage
    dims = ParallelDims(pp=4, dp=1, cp=1, tp=2)
    assert dims.embedding_groups() == [[0, 6], [1, 7]]
    assert dims.embedding_span().stride == 6 and dims.embedding_span().size == 2
    # pp=2, cp=2: one pair per (dp, cp, tp) coordinate
    assert ParallelDims(pp=2, dp=1, cp=2, tp=1).embedding_groups() == [[0, 2], [1, 3]]


def test_nodes_fill_with_consecutive_ranks():
    dims = ParallelDims(pp=4, dp=2, cp=1, tp=4)  # 32 ranks; a pipeline rank is 8 consecutive ranks
    assert dims.pipeline_nodes(8) == (0, 1, 2, 3)
    assert dims.pipeline_nodes(16) == (0, 0, 1, 1)
    assert dims.ranks_on_node(8) == 8 and ParallelDims(tp=2).ranks_on_node(8) == 2
    assert dims.span("tp").fits_in_node(8) and not dims.span("dp_cp").fits_in_node(4)
    assert dims.span("pp").members_per_node(16) == 2


def test_filling_gives_dp_the_ranks_left():
    assert ParallelDims.filling(64, pp=2, cp=2, tp=4) == ParallelDims(pp=2, dp=4, cp=2, tp=4)
    assert ParallelDims.filling(60, pp=8, tp=1) is None


def test_rank_out_of_range():
    with pytest.raises(ValueError):
        ParallelDims(pp=2, dp=2, cp=2, tp=2).coords(16)
    with pytest.raises(ValueError):
        ParallelDims(pp=2, dp=2).rank(pp=2)


def test_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None\nimport autoplan.schema.parallel_dims"
    subprocess.run([sys.executable, "-c", code], check=True)


# expert layers: the ranks of a pipeline rank regrouped as etp x ep x edp (Megatron-Core's "tp-ep-dp-pp")

def test_expert_groups_take_consecutive_ranks_with_etp_fastest():
    dims = ParallelDims(pp=2, dp=4, cp=1, tp=2, ep=4, etp=1)  # 16 ranks; a pipeline rank is 8 consecutive ones
    assert dims.edp == 2
    assert dims.expert_groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert dims.expert_groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]
    assert dims.expert_coords(13) == (1, 1, 1, 0)
    assert dims.expert_span("ep") == GroupSpan(4, 1) and dims.expert_span("edp") == GroupSpan(2, 4)


def test_expert_tensor_parallel_inside_expert_parallel():
    dims = ParallelDims(pp=1, dp=4, cp=2, tp=1, ep=2, etp=2)  # 8 ranks: etp pairs, ep pairs of pairs, edp 2
    assert dims.expert_groups("etp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.expert_groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.expert_groups("ep_etp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dims.expert_groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(("pp", "dp", "cp", "tp", "ep", "etp"),
                         [(1, 8, 1, 1, 8, 1), (2, 2, 2, 2, 4, 2), (3, 4, 1, 2, 2, 1), (1, 2, 2, 2, 1, 4)])
def test_expert_groups_partition_the_world(pp, dp, cp, tp, ep, etp):
    dims = ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, etp=etp)
    assert dims.expert_fold_error() is None
    for group in ("ep", "etp", "edp", "ep_etp"):
        groups = dims.expert_groups(group)
        assert sorted(r for g in groups for r in g) == list(range(dims.world_size))
        span = dims.expert_span(group)
        assert all(len(g) == span.size and all(b - a == span.stride for a, b in zip(g, g[1:])) for g in groups)
        # a group never leaves its pipeline rank: experts are regrouped within the stage's ranks
        assert all(len({dims.coords(r).pp for r in g}) == 1 for g in groups)


def test_expert_fold_must_divide_the_stage_ranks():
    assert "must divide the tp x cp x dp = 6" in ParallelDims(dp=3, tp=2, ep=4).expert_fold_error()
    assert ParallelDims(dp=4, tp=2).as_dict() == {"pp": 1, "dp": 4, "cp": 1, "tp": 2}
    assert ParallelDims(dp=4, tp=2, ep=8).as_dict()["ep"] == 8
