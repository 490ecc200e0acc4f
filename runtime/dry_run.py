"""``python -m runtime.dry_run plan.yaml --rank R``: build one rank of a plan, at its real size, without
training and without a cluster, and print (one JSON object) what that rank holds.

The rank joins a fake process group of the plan's world size (torch's ``fake`` backend: collectives
are no-ops, group creation works), builds its stages exactly as training would (runtime/build.py: meta
device, TP, recomputation, FSDP2 / replicate, PipelineStage and the plan's schedule lowered by torch,
the optimizer) and stops before ``to_empty``, so a rank of a 1024-GPU llama3-70b plan takes seconds and
little memory on a laptop. ``autoplan run PLAN --dry-run`` runs this once per rank asked for, each in
its own process (so each rank's peak resident memory is its own).

``local_params`` counts the parameter elements the rank holds during forward and backward: a parameter
under a ZeRO-3 FSDP2 group (resharded after forward) counts its padded shard (what FSDP2 allocates on
every rank); one under ZeRO 0-2 (kept unsharded through the step) its TP-local size; one outside FSDP
its local (TP) tensor. ``expected_local_params`` is the plan's ``predicted.local_params_per_rank`` entry
for the rank's pipeline rank (autoplan/cost/local_params.py).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time

from autoplan.errors import SpecError

GIB = 1024 ** 3


def held_params(models) -> int:
    """Parameter elements a rank holds for forward/backward (see the module docstring).

    Reads FSDP2's per-parameter records (``FSDPParam``: padded shard size, unsharded size, and whether
    its group reshards after forward): private attributes, but torch 2.13 has no public way to ask for
    the padded shard FSDP2 allocates, and the meta parameters carry no storage to measure."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    counted: dict[int, int] = {}
    for model in models:
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            reshards = group.post_forward_mesh_info is not None  # ZeRO-3: only the shard stays
            for fp in group.fsdp_params:
                size = fp.padded_sharded_param_size if reshards else fp._orig_size
                counted[id(fp.sharded_param)] = math.prod(size)
        for p in model.parameters():
            if id(p) not in counted:
                counted[id(p)] = (p.to_local() if isinstance(p, DTensor) else p).numel()
    return sum(counted.values())


def stage_summary(plan, stage_id: int, model) -> dict:
    """What the built stage module holds (read from the module, not the plan)."""
    blocks = sorted(int(k) for k in model.blocks)
    stage = plan.stages[stage_id]
    return {"index": stage_id, "layers": [blocks[0], blocks[-1] + 1] if blocks else [],
            "embedding": model.embed is not None, "head": model.head is not None,
            "full_recompute": [k for k in blocks if stage.recompute_of(k) == "full"],
            "selective_recompute": [k for k in blocks if stage.recompute_of(k) == "selective"]}


def dry_run(plan, rank: int) -> dict:
    t0 = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.build import build_parts
    from runtime.mesh import mesh_of_plan

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
    try:
        pm = mesh_of_plan(plan, torch.device("cpu"))
        parts = build_parts(plan, pm, materialize=False)
        held = held_params(parts.models)
    finally:
        dist.destroy_process_group()
    per_rank = plan.predicted.local_params_per_rank if plan.predicted else ()
    expected = per_rank[pm.pp_rank] if per_rank else None
    return {"rank": rank, "pp_rank": pm.pp_rank, "dp_rank": pm.dp_rank, "cp_rank": pm.cp_rank,
            "tp_rank": pm.tp_rank,
            "local_params": held, "expected_local_params": expected,
            "stages": [stage_summary(plan, sid, m) for sid, m in zip(parts.stage_ids, parts.models)],
            "wall_s": round(time.perf_counter() - t0, 3),
            "max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="runtime.dry_run", description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--rank", type=int, required=True)
    args = p.parse_args(argv)
    try:
        from autoplan.schema import load_plan
        plan = load_plan(args.plan)
        if not 0 <= args.rank < plan.world_size:
            raise SpecError(f"--rank: {args.rank} is outside the plan's world of {plan.world_size} ranks "
                            f"(0 to {plan.world_size - 1})")
    except SpecError as err:
        print(f"runtime.dry_run: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(dry_run(plan, args.rank)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
