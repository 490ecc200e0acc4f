"""``autoplan plan``: search the fastest plan that fits, print the best few, write the winner."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from autoplan.cli.common import add_input_arguments, add_layout_arguments, load_inputs, load_stack_arg, runnable_spec
from autoplan.errors import SpecError

DESCRIPTION = """\
Search the fastest plan that fits. The search is a best-first branch-and-bound over the configurations
(tp, cp, pp, dp, sequence parallel, micro-batch size, then ZeRO stage, offload and schedule), the stage splits
and the per-rank recomputation: every candidate carries a lower bound on its step time, layouts are
simulated only while their bound can still beat the best plans found, and per-rank recomputation is an
integer program solved exactly (in closed form, by enumeration or by OR-Tools CP-SAT). OPTIMAL means no
plan in the search space is faster under the cost model; with --time-limit the best plan found so far is
returned as FEASIBLE, with the proven lower bound."""


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="find the fastest parallel plan that fits and write it as YAML",
                              description=DESCRIPTION)
    add_input_arguments(p)
    add_layout_arguments(p, required=False)
    p.add_argument("-o", "--output", help="write the winning plan to this YAML file")
    p.add_argument("--top", type=int, default=5, help="how many plans to list (5)")
    p.add_argument("--solver", choices=["bnb", "bruteforce"], default="bnb",
                   help="bnb: branch-and-bound (default); bruteforce: every layout, for checking on small problems")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop after this long with the best plan found (status FEASIBLE unless proven OPTIMAL)")
    p.set_defaults(func=run)


def pins_of(args: argparse.Namespace):
    from autoplan.search.space import Pins

    return Pins(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Pins)})


def stderr_progress(message: str, final: bool) -> None:
    """On a terminal one line rewritten in place; in a pipe or a log, one line each time."""
    if sys.stderr.isatty():
        print(f"\r{message:<100}", end="\n" if final else "", file=sys.stderr, flush=True)
    else:
        print(message, file=sys.stderr, flush=True)


def _zero_bubble_gain(best, predicted, model, fn, cluster, training, pins) -> str | None:
    """A zero-bubble winner's line on what its schedule bought (``predicted``: the winner's, as ranked): the
    same configuration searched under the classic schedule with the same stages per rank (1f1b, gpipe where
    m < pp, or interleaved for two or more)."""
    from autoplan.report.why import schedule_gain
    from autoplan.schema.schedule import ZERO_BUBBLE
    from autoplan.search.planner import search
    from autoplan.search.result import predicted_of

    c = best.config
    if c.schedule not in ZERO_BUBBLE:
        return None
    classic = "interleaved" if c.virtual_stages > 1 else "1f1b" if c.num_microbatches >= c.pp else "gpipe"
    fixed = {f.name: getattr(c, f.name) for f in dataclasses.fields(pins) if f.name != "recompute"}
    same = dataclasses.replace(pins, **{**fixed, "schedule": classic})
    other = search(model, fn, cluster, training, same, top_k=1).best
    label = f"interleaved (v={c.virtual_stages})" if classic == "interleaved" else classic
    return schedule_gain(c.schedule, predicted, label,
                         predicted_of(other, cluster, training)[1] if other else None)


def module_ref(model):
    """The plan's reference to a user's own module: a profile of ``package.module:factory`` (None for
    anything else, e.g. a profile of another architecture's config.json)."""
    from autoplan.schema.model import ModelSpec
    from autoplan.schema.plan import ModuleRef

    if isinstance(model, ModelSpec) or ":" not in model.source or model.source.endswith((".yaml", ".json")):
        return None
    return ModuleRef(factory=model.source, name=model.name, total_params=model.total_params,
                     num_blocks=len(model.blocks))


def refuse_for_module(args: argparse.Namespace) -> None:
    """What a plan for a user's own module cannot pin (schema/plan.py MODULE_PLAN_REFUSALS), in one line."""
    from autoplan.schema.plan import MODULE_PLAN_REFUSALS

    if args.cp is not None and args.cp > 1:
        raise SpecError(f"--cp: {MODULE_PLAN_REFUSALS['cp'].replace('use cp: 1', 'drop --cp')}")
    if args.sequence_parallel:
        raise SpecError("--sequence-parallel: " + MODULE_PLAN_REFUSALS["sequence_parallel"].replace(
            "use sequence_parallel: false", "drop --sequence-parallel"))
    if args.recompute == "selective":
        raise SpecError("--recompute selective: " + MODULE_PLAN_REFUSALS["selective_recompute"].replace(
            "use full_recompute for those blocks", "use --recompute full or none"))


def module_plan_of(layout, module, cluster, training, predicted, info, stack):
    """The winner as a plan for a user's own module. A profile prices selective recomputation at nothing
    saved and nothing spent (cost/profile_ops.py: no attention core), so blocks the search marked selective
    run without recomputation: the same plan by the cost model, and one the runtime can run."""
    from autoplan.schema.plan import ModulePlan

    stages = tuple(dataclasses.replace(s, selective_recompute=()) for s in layout.stages)
    fields = {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}
    plan = ModulePlan(**{**fields, "stages": stages}, module=module, cluster=cluster, training=training,
                      predicted=predicted, solver=info, stack=stack)
    plan.validate()
    return plan


def run(args: argparse.Namespace) -> int:
    # imported here so that `autoplan --help` does not load the search (and OR-Tools behind it)
    from autoplan.cost.model_workload import workload_fn
    from autoplan.report.tables import breakdown_table, ranking_table
    from autoplan.report.why import why_winner
    from autoplan.schema import dump_plan, plan_to_dict
    from autoplan.schema._io import to_dict, write_atomic
    from autoplan.search.planner import search
    from autoplan.search.result import explain_infeasible, plan_of, predicted_of, require_plan, solver_info
    from autoplan.schema.plan import context_parallel_refusal
    from autoplan.search.space import check_size, tp_options

    if args.time_limit is not None and not args.time_limit > 0:
        raise SpecError(f"--time-limit: must be a positive number of seconds, got {args.time_limit}")
    if args.top < 1:
        raise SpecError(f"--top: must be at least 1, got {args.top}")
    model, cluster, training = load_inputs(args)
    check_size(model, cluster, training)
    spec = runnable_spec(model)
    module = module_ref(model) if spec is None else None
    if args.output and spec is None and module is None:
        raise SpecError(f"-o: a plan file embeds a model the runtime can build, and profile {model.name!r} "
                        f"(of {model.source}) is neither a shipped model, a spec file nor a package.module:factory; "
                        "plan it without -o")
    if module is not None and args.output:
        refuse_for_module(args)
    pins = pins_of(args)
    if module is not None and args.output:  # what the runtime cannot do for a user's module is not searched
        pins = dataclasses.replace(pins, cp=1, sequence_parallel=False)
    allowed = tp_options(model, cluster)
    if pins.tp is not None and pins.tp not in allowed:
        raise SpecError(f"--tp: {pins.tp} must divide the devices per node ({cluster.devices_per_node}) and the "
                        f"model's heads, KV heads, FFN width and vocabulary; use one of {allowed}")
    if pins.cp is not None and cluster.num_devices % pins.cp:
        raise SpecError(f"--cp: {pins.cp} does not divide the cluster's {cluster.num_devices} devices")
    if pins.cp is not None and pins.cp > 1:
        refusal = context_parallel_refusal(pins.cp, spec, training) if spec is not None else (
            f"{model.name} is a profile, which does not record the K/V width ring attention exchanges; plan the "
            "model spec or config.json")
        if refusal:
            raise SpecError(f"--cp: {refusal}")
    if pins.sequence_parallel and max(allowed if pins.tp is None else [pins.tp]) <= 1:
        raise SpecError("--sequence-parallel: needs tp > 1 (it splits norms and dropout within the TP group), "
                        f"and {'--tp 1 is pinned' if pins.tp == 1 else 'no tp > 1 fits this model and cluster'};"
                        " pin --tp 2 or more, or drop --sequence-parallel")
    if pins.offload_optimizer and pins.zero_stage == 0:
        raise SpecError("--offload: needs ZeRO stage >= 1 (it offloads the sharded optimizer state) and "
                        "--zero-stage 0 is pinned; pin --zero-stage 1 or more, or drop --offload")
    stack = load_stack_arg(args)
    # the workload names its stack: the search keeps to the schedules it runs (search/planner.py ``search``)
    make = lambda m, c, t: workload_fn(m, c, t, stack, rescale=args.rescale_profile)  # noqa: E731
    result = search(model, make(model, cluster, training), cluster, training, pins, solver=args.solver,
                    top_k=args.top, progress=stderr_progress, time_limit_s=args.time_limit)
    if result.status == "UNKNOWN":
        bound = (f" (lower bound {result.bound_ns * 1e-9:.3f} s per step so far)" if args.solver == "bnb" else
                 f" ({result.simulated:,} layouts simulated)")
        raise SpecError(f"--time-limit: no plan found in {args.time_limit:g} s{bound}; allow more time"
                        + ("" if args.solver == "bnb" else ", or use --solver bnb"))
    require_plan(result, lambda: explain_infeasible(model, make, cluster, training, pins))
    info = solver_info(result, args.solver)
    ranked = [predicted_of(c, cluster, training) for c in result.ranked]
    if spec is not None:
        best = plan_of(spec, cluster, training, result.best, info)
        if args.output:
            write_atomic(args.output, dump_plan(best))
        data = {k: v for k, v in plan_to_dict(best).items() if k not in ("model", "cluster", "training")}
    else:
        layout, predicted = ranked[0]
        data = {**to_dict(layout), "predicted": to_dict(predicted), "solver": to_dict(info)}
        if module is not None and args.output:
            from autoplan.schema.io import dump_module_plan

            write_atomic(args.output, dump_module_plan(module_plan_of(layout, module, cluster, training, predicted,
                                                                      info, result.best.workload.stack)))
    if args.json:
        data["model"], data["cluster"], data["stack"] = model.name, cluster.name, stack.name
        print(json.dumps(data))
        return 0
    print(f"{model.name} on {cluster.name}: {cluster.num_nodes} x {cluster.devices_per_node} {cluster.device.name}, "
          f"global batch {training.global_batch_size} x {training.seq_len} tokens, {training.precision}, "
          f"stack {stack.name}")
    proof = ""
    if result.status == "FEASIBLE" and args.solver == "bruteforce":
        proof = ", the best of the layouts it reached (brute force proves no bound)"
    elif result.status == "FEASIBLE":
        gap = result.best.step_ns / max(1, result.bound_ns) - 1
        proof = f", within {100 * gap:.1f}% of optimal (bound {result.bound_ns * 1e-9:.3f} s)"
    rest = "stopped by --time-limit" if result.status == "FEASIBLE" else "the rest pruned by bounds"
    print(f"solver {args.solver}: {result.status} in {result.wall_s:.2f} s{proof} ({result.considered} "
          f"configurations, {result.evaluated} with layouts simulated ({result.simulated} layouts), {rest})\n")
    print(ranking_table(ranked))
    print("\n" + why_winner(ranked))
    gain = _zero_bubble_gain(result.best, ranked[0][1], model, make(model, cluster, training), cluster, training,
                             pins)
    if gain:
        print(gain)
    print("\n" + breakdown_table(ranked[0][1]))
    if args.output:
        print(f"\nwrote {args.output}")
    return 0
