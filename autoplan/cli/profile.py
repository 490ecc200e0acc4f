"""``autoplan profile MODEL``: trace a model layer by layer and write its profile YAML (imports torch)."""

from __future__ import annotations

import argparse
import sys

from autoplan.errors import SpecError
from autoplan.schema.limits import MAX_DEVICES_PER_NODE, MAX_SEQ_LEN


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


MAX_SIZES = 16
"""Sizes per list option: each one is a separate trace of every block."""
MAX_PROFILED_MICRO_BATCH = 2**16
"""Published micro-batches are 1 to a few hundred sequences."""
MAX_TOKENS_PER_MICRO_BATCH = MAX_SEQ_LEN
"""micro-batch x seq_len; beyond it even meta tensors overflow (b x heads x s x s attention scores)."""


def int_list(text: str, option: str, high: int) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2); anything else is a one-line SpecError naming the option."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise SpecError(f"{option}: expected comma-separated whole numbers >= 1, e.g. 1,2; got {text!r}")
    if len(values) > MAX_SIZES or max(values) > high:
        raise SpecError(f"{option}: at most {MAX_SIZES} sizes, each at most {high:,}; got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from autoplan.profiler.model_profile import DTYPES, ProfileOptions, profile_model, summary_rows
    from autoplan.schema._io import write_atomic
    from autoplan.schema.profile import dump_profile

    if args.dtype not in DTYPES:
        raise SpecError(f"--dtype: {args.dtype!r} is not one of {', '.join(DTYPES)}")
    if args.seq_len is not None and not 1 <= args.seq_len <= MAX_SEQ_LEN:
        raise SpecError(f"--seq-len: must be in [1, {MAX_SEQ_LEN:,}], got {args.seq_len}")
    if not (1 <= args.repeats <= 1000 and 0 <= args.warmup <= 1000):
        raise SpecError("--repeats must be in [1, 1000] and --warmup in [0, 1000]")
    micro_batch_sizes = int_list(args.micro_batch_sizes, "--micro-batch-sizes", MAX_PROFILED_MICRO_BATCH)
    if args.seq_len is not None and max(micro_batch_sizes) * args.seq_len > MAX_TOKENS_PER_MICRO_BATCH:
        raise SpecError(f"--micro-batch-sizes x --seq-len: {max(micro_batch_sizes)} x {args.seq_len} tokens per "
                        f"micro-batch; at most {MAX_TOKENS_PER_MICRO_BATCH:,}")
    options = ProfileOptions(device=args.device, dtype=args.dtype,
                             micro_batch_sizes=micro_batch_sizes,
                             seq_len=args.seq_len, tp_sizes=int_list(args.tp_sizes, "--tp-sizes", MAX_DEVICES_PER_NODE),
                             warmup=args.warmup, repeats=args.repeats, progress=not args.quiet)
    try:
        profile = profile_model(args.model, options)
    except RuntimeError as err:  # torch refuses shapes whose element count overflows, even on meta
        if "overflow" not in str(err):
            raise
        raise SpecError(f"{args.model}: the shapes are too large to trace ({str(err).splitlines()[0][:120]}); "
                        "lower --seq-len or --micro-batch-sizes") from None
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
