"""Mixture-of-Experts models as the runtime builds them (fast, one process): moe-tiny's blocks and parameter
count against the spec's count, its initial values, what a rank of an expert-parallel plan holds against
autoplan/cost/local_params.py (the ``autoplan run --dry-run`` comparison), the expert groups against
ParallelDims' fold, and the one-line refusals of what the runtime does not run (MLA, MTP).
The layouts' training equality to serial is test_moe_layouts.py (slow)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from autoplan.cost.local_params import local_params_per_rank
from autoplan.errors import SpecError
from autoplan.schema import load_model
from moe_cases import moe_plan


def test_moe_tiny_builds_its_moe_blocks_with_the_spec_parameter_count():
    from runtime.models import build_model
    from runtime.models.moe import MoE

    spec = load_model("moe-tiny")
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.total_params() == 256_064
    kinds = [type(model.blocks[str(i)].mlp).__name__ for i in range(spec.num_layers)]
    assert kinds == ["MLP", "MoE", "MoE", "MoE"]  # first_dense_layers: 1
    moe = model.blocks["1"].mlp
    assert isinstance(moe, MoE) and tuple(moe.experts.down.shape) == (8, 64, 32) and moe.shared is None
    # residual-scaled init for the experts' down projection, as for the dense one: 0.02 / sqrt(2 L)
    residual = 0.02 / math.sqrt(2 * spec.num_layers)
    assert moe.experts.down.std().item() == pytest.approx(residual, rel=0.05)
    assert moe.experts.gate.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks["0"].mlp.down.weight.std().item() == pytest.approx(residual, rel=0.1)


def test_shared_experts_are_built_and_counted():
    from runtime.models import build_model

    spec = load_model("moe-tiny")
    spec = dataclasses.replace(spec, name="moe-tiny-shared", moe=dataclasses.replace(spec.moe, num_shared_experts=2))
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()
    assert tuple(model.blocks["3"].mlp.shared.down.weight.shape) == (64, 64)  # 2 shared x width 32


# (layout, why): every rank of each is built on a fake process group and compared with the count
LAYOUTS = [
    dict(dp=4, ep=2, zero=3),  # experts: 8 / ep 2 = 4 rows, ZeRO-3 over edp 2: 2 rows each
    dict(dp=4, ep=4, zero=3),  # edp 1: the experts' own unit holds whole EP shards
    dict(dp=4, ep=2, zero=1),
    dict(dp=4, ep=2, zero=0),  # replicate: experts over edp, the rest over dp
    dict(tp=4, ep=2, sp=True, zero=3),  # dp 1: only the experts are sharded (edp 2)
    dict(tp=2, dp=2, ep=2, sp=True, zero=3),  # router whole per TP rank; attention split
    dict(pp=2, dp=2, ep=2, schedule="1f1b", zero=3),  # dense first block on stage 0 only
    dict(tp=2, dp=2, sp=True, zero=3),  # ep 1: experts ZeRO-3 over edp = 4 ranks, dense over dp 2
    dict(dp=3, ep=1, zero=3),  # uneven chunks: 8 expert rows over 3 ranks, padded to 3
    dict(model="moe-tiny-sigmoid", tp=2, dp=2, ep=2, sp=True, zero=3),  # a shared expert, split over TP
    dict(model="moe-tiny-sigmoid", tp=2, dp=2, ep=2, sp=True, zero=1),
    dict(tp=2, dp=2, ep=2, etp=2, sp=True, zero=3),  # etp 2: each expert's width halved, edp 1
    dict(tp=2, dp=2, etp=2, sp=True, zero=2),  # etp without ep: all 8 experts, half their width
    dict(dp=4, etp=2, zero=3),  # etp over replicas, ZeRO-3 over edp 2
    dict(tp=4, ep=2, etp=2, sp=True, zero=0),  # replicate over edp 1
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_built_moe_rank_holds_the_counted_parameters(kw):
    from runtime.dry_run import dry_run

    plan = moe_plan(**kw)
    expected = local_params_per_rank(plan.model, plan.layout(), plan.training)
    for rank in sorted({0, plan.world_size - 1}):
        got = dry_run(plan, rank)
        assert got["local_params"] == expected[got["pp_rank"]], (rank, got, expected)


def test_local_params_of_an_ep2_rank_by_hand():
    # moe-tiny, dp4 ep2 ZeRO-0: dense parts whole; each MoE block holds 4 of the 8 experts (3 x 4 x 32 x 64)
    spec = load_model("moe-tiny")
    plan = moe_plan(dp=4, ep=2, zero=0)
    [got] = local_params_per_rank(spec, plan.layout(), plan.training)
    experts_held = 3 * (4 * 3 * 32 * 64)
    assert got == spec.total_params() - 3 * (8 * 3 * 32 * 64) + experts_held == 256_064 - 73_728


def test_expert_mesh_groups_are_the_plans_fold():
    """The expert DeviceMesh runtime/mesh.py builds: each rank's ep / edp / etp group is ParallelDims'
    (checked inside build_expert_mesh against expert_group_of; here: that the check sees tp-first EP groups)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.mesh import mesh_of_plan

    plan = moe_plan(tp=2, dp=2, ep=2, sp=True)
    for rank in (0, 3):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            pm = mesh_of_plan(plan, torch.device("cpu"))
            ep = sorted(dist.get_process_group_ranks(pm.ep_mesh.get_group()))
            edp = sorted(dist.get_process_group_ranks(pm.edp_mesh.get_group()))
        finally:
            dist.destroy_process_group()
        assert ep == plan.dims.expert_group_of(rank, "ep") == ([0, 1] if rank == 0 else [2, 3])  # a TP pair
        assert edp == plan.dims.expert_group_of(rank, "edp") == ([0, 2] if rank == 0 else [1, 3])


def test_expert_mesh_groups_with_etp_are_the_plans_fold():
    """etp = tp = 2, ep 2 on 4 ranks: the ETP group is the TP pair, the EP group the two replicas' pairs
    (etp fastest in the fold), edp 1; and the runtime accepts the plan (no etp refusal any more)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.mesh import mesh_of_plan
    from runtime.validate import check_runtime_support

    plan = moe_plan(tp=2, dp=2, ep=2, etp=2, sp=True)
    check_runtime_support(plan)
    for rank in (0, 3):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            pm = mesh_of_plan(plan, torch.device("cpu"))
            groups = {axis: sorted(dist.get_process_group_ranks(pm.expert_mesh[axis].get_group()))
                      for axis in ("ep", "etp", "edp")}
        finally:
            dist.destroy_process_group()
        assert groups["etp"] == plan.dims.expert_group_of(rank, "etp") == ([0, 1] if rank == 0 else [2, 3])
        assert groups["ep"] == plan.dims.expert_group_of(rank, "ep") == ([0, 2] if rank == 0 else [1, 3])
        assert groups["edp"] == [rank]


@pytest.mark.parametrize("model", ["deepseek-v3"])
def test_mla_and_mtp_are_refused_in_one_line(model):
    from runtime.models import build_model

    with pytest.raises(SpecError, match="multi-head latent attention .* multi-token-prediction .* do not build yet"):
        build_model(load_model(model), device="meta")


def test_moe_in_a_gpt_model_is_refused():
    from runtime.models import build_model

    spec = dataclasses.replace(load_model("gpt-tiny"), moe=load_model("moe-tiny").moe)
    with pytest.raises(SpecError, match="moe: MoE blocks are built for architecture llama only"):
        build_model(spec, device="meta")


def test_hugging_face_folders_refuse_moe_models_in_one_line():
    from runtime.hf.names import sources

    with pytest.raises(SpecError, match="^moe-tiny: moe: Hugging Face import and export .* cover mixtral"):
        sources(load_model("moe-tiny"))
