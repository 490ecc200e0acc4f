"""``autoplan profile MODEL``: trace a model layer by layer and write its profile YAML (imports torch)."""

from __future__ import annotations

import argparse
import sys

from autoplan.errors import SpecError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="trace a model into layers (params, FLOPs, saved bytes, TP splits, times)",
        description="Profile MODEL: a shipped model name or spec file, a Hugging Face config.json "
                    "(built from the config only; needs transformers), or package.module:factory returning "
                    "(module, example_batch). The whole model is traced on meta; on cpu/cuda one block of each "
                    "kind is also timed.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", default="profile.yaml", help="profile YAML to write (default profile.yaml)")
    p.add_argument("--device", default="meta", help="meta (trace only, no timing), cpu or cuda (default meta)")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    p.add_argument("--micro-batch-sizes", default="1", help="comma-separated, e.g. 1,2 (default 1)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    p.add_argument("--tp-sizes", default="1,2,4,8",
                   help="comma-separated TP sizes to shard blocks at (default 1,2,4,8; sizes a block does not "
                   "shard at are skipped), so that one profile plans for every TP size the model allows")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per block shape (median; default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def int_list(text: str, option: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2); anything else is a one-line SpecError naming the option."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise SpecError(f"{option}: expected comma-separated whole numbers >= 1, e.g. 1,2; got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from autoplan.profiler.model_profile import DTYPES, ProfileOptions, profile_model, summary_rows
    from autoplan.schema._io import write_atomic
    from autoplan.schema.profile import dump_profile

    if args.dtype not in DTYPES:
        raise SpecError(f"--dtype: {args.dtype!r} is not one of {', '.join(DTYPES)}")
    if args.seq_len is not None and args.seq_len < 1:
        raise SpecError(f"--seq-len: must be at least 1, got {args.seq_len}")
    if args.repeats < 1 or args.warmup < 0:
        raise SpecError("--repeats must be >= 1 and --warmup >= 0")
    options = ProfileOptions(device=args.device, dtype=args.dtype,
                             micro_batch_sizes=int_list(args.micro_batch_sizes, "--micro-batch-sizes"),
                             seq_len=args.seq_len, tp_sizes=int_list(args.tp_sizes, "--tp-sizes"),
                             warmup=args.warmup, repeats=args.repeats, progress=not args.quiet)
    profile = profile_model(args.model, options)
    write_atomic(args.output, dump_profile(profile))
    _print_summary(profile, summary_rows(profile), args.output)
    return 0


def _print_summary(profile, rows, path: str) -> None:
    blocks = [r for r in rows if r["kind"] == "block"]
    shown = rows[:2] + ([{"name": f"... {len(blocks) - 1} more blocks"}] if len(blocks) > 1 else []) + rows[-1:]
    print(f"{profile.name}: {profile.total_params:,} params, {len(blocks)} blocks, "
          f"micro-batch {profile.micro_batch_sizes[0]}, seq {profile.seq_len}, {profile.dtype} on {profile.device}")
    print(f"{'layer':<24}{'params':>14}{'fwd GFLOP':>12}{'saved MiB':>11}{'out MiB':>10}{'fwd ms':>9}{'bwd ms':>9}  tp")
    for r in shown:
        if "kind" not in r:
            print(r["name"])
            continue
        ms = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"  # noqa: E731
        print(f"{r['name']:<24}{r['params']:>14,}{r['fwd_gflop']:>12.3f}{r['saved_mib']:>11.2f}{r['out_mib']:>10.2f}"
              f"{ms(r['fwd_ms'])}{ms(r['bwd_ms'])}  {r['tp_splits']}")
    print(f"wrote {path}", file=sys.stderr)
