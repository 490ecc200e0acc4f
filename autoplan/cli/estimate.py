"""``autoplan estimate``: the cost model's verdict on one given configuration, with its breakdown.

Exit status: 0 when the configuration fits, ``DOES_NOT_FIT_STATUS`` (3) when it is valid but its peak memory
exceeds the capacity (the verdict, tables, JSON and ``-o`` plan are still written), 2 on bad input."""

from __future__ import annotations

import argparse
import dataclasses
import json

from autoplan.cli.common import add_input_arguments, add_layout_arguments, load_inputs, load_stack_arg, runnable_spec
from autoplan.errors import SpecError
from autoplan.report.tables import breakdown_table, layout_label, recompute_label
from autoplan.schema import Layout, ParallelConfig, ParallelDims, Plan, SolverInfo, check_fits, dump_plan, plan_to_dict
from autoplan.schema._io import to_dict, write_atomic
from autoplan.schema.plan import parallel_dimensions

DOES_NOT_FIT_STATUS = 3


def register(subparsers) -> None:
    p = subparsers.add_parser("estimate", help="predict step time, MFU and memory of one given configuration",
                              epilog=f"exit status: 0 fits, {DOES_NOT_FIT_STATUS} does not fit, 2 bad input")
    add_input_arguments(p)
    add_layout_arguments(p, required=True)
    p.add_argument("-o", "--output", help="also write this configuration as a plan file")
    p.set_defaults(func=run)


def even_layout(args: argparse.Namespace, num_layers: int, num_devices: int, global_batch: int,
                dense_layers: int = 0) -> Layout:
    """The configuration given on the command line (the dimensions left out take their defaults), with
    the layers split evenly and every layer recomputed as ``--recompute`` says; a MoE model's
    ``dense_layers`` leading dense blocks all on stage 0, never recomputed (cost/stage_table.py)."""
    from autoplan.cost.estimate import layout_of
    from autoplan.cost.evaluate import StageShape
    from autoplan.search.space import table_splits

    given = {f.name: getattr(args, f.name) for f in parallel_dimensions() if f.metadata["pinnable"]}
    cp = given["cp"] or 1
    filled = ParallelDims.filling(num_devices, pp=args.pp, cp=cp, tp=args.tp)
    if given["dp"] is None and filled is None:
        raise SpecError(f"--tp/--pp/--cp: tp x pp x cp = {args.tp * args.pp * cp} does not divide the cluster's "
                        f"{num_devices} devices; give --dp or other sizes")
    dp = given["dp"] or filled.dp
    if global_batch % (dp * args.micro_batch_size):
        raise SpecError(f"--micro-batch-size: global batch {global_batch} is not divisible by dp x micro-batch "
                        f"= {dp} x {args.micro_batch_size}")
    defaults = {"dp": dp, "cp": 1, "ep": 1, "etp": 1, "virtual_stages": 2 if args.schedule == "interleaved" else 1,
                "sequence_parallel": False, "offload_optimizer": False}
    values = {k: (defaults[k] if v is None else v) for k, v in given.items()}
    values["num_microbatches"] = global_batch // (dp * args.micro_batch_size)
    stages = args.pp * values["virtual_stages"]
    if stages > num_layers:
        raise SpecError(f"--pp: pp x virtual stages = {stages} exceeds the {num_layers} layers")
    # the even split (stage 0 counting only its MoE blocks when the model has leading dense ones)
    split = table_splits(num_layers, stages, 0, dense_layers)[0]
    mode = args.recompute or "none"
    k = dense_layers if mode == "full" else 0  # full: the dense blocks too (they have no selective mode)
    shapes = tuple(StageShape(n + (dense_layers if i == 0 else 0), n if mode == "selective" else 0,
                              n + (k if i == 0 else 0) if mode == "full" else 0) for i, n in enumerate(split))
    return layout_of(ParallelConfig(**values), shapes, dense_layers - k)


def run(args: argparse.Namespace) -> int:
    from autoplan.cost.estimate import estimate_layout, with_local_params
    from autoplan.cost.model_workload import workload_fn
    from autoplan.search.space import dense_layers_of, num_layers_of, tp_options

    model, cluster, training = load_inputs(args)
    layout = even_layout(args, num_layers_of(model), cluster.num_devices, training.global_batch_size,
                         dense_layers_of(model))
    spec = runnable_spec(model)
    if spec is not None:
        check_fits(layout, spec, training, cluster.num_devices)
    else:
        Layout.validate(layout)
        if layout.tp not in tp_options(model, cluster):
            raise SpecError(f"tp: the profile's blocks shard at tp in {tp_options(model, cluster)}, not {layout.tp}")
    if args.output and spec is None:
        raise SpecError(f"-o: profile {model.name!r} is not of a model the runtime can build; estimate it without -o")
    stack = load_stack_arg(args)
    predicted, evaluation, _ = estimate_layout(workload_fn(model, cluster, training, stack, rescale=args.rescale_profile),
                                               cluster, training, layout)
    fits = predicted.peak_memory_gib <= predicted.capacity_gib
    info = SolverInfo(name="given", status="FITS" if fits else "DOES_NOT_FIT", objective=predicted.step_time_s,
                      wall_s=0.0)
    if spec is not None:
        predicted = with_local_params(predicted, spec, layout, training)
        plan = Plan(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}, model=spec,
                    cluster=cluster, training=training, predicted=predicted, solver=info, stack=stack)
        if args.output:
            write_atomic(args.output, dump_plan(plan))
        data = {k: v for k, v in plan_to_dict(plan).items() if k not in ("model", "cluster", "training")}
    else:
        data = {**to_dict(layout), "predicted": to_dict(predicted), "solver": to_dict(info)}
    if args.json:
        data["model"], data["cluster"], data["fits"], data["stack"] = model.name, cluster.name, fits, stack.name
        print(json.dumps(data))
        return 0 if fits else DOES_NOT_FIT_STATUS
    print(f"{model.name} on {cluster.name} ({cluster.num_devices} x {cluster.device.name}): {layout_label(layout)}, "
          f"recompute {recompute_label(layout)}, stack {stack.name}")
    print(("fits" if fits else "DOES NOT FIT") + f": peak {predicted.peak_memory_gib:.1f} GiB of "
          f"{predicted.capacity_gib:.1f} GiB\n")
    print(breakdown_table(predicted))
    return 0 if fits else DOES_NOT_FIT_STATUS
