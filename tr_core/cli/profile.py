"""`python -m tr_core profile`: its options, their checks before any model is touched, and the run (the measuring
itself: tr_core/bench/profile.py)."""
from __future__ import annotations

import argparse
import sys

import torch

from ..bench import profile
from ..kernels import describe_plan
from ..models import check_device, load_model, parse_dtype
from .options import add_model_options, apply_threads, output_problem, report_error, threads_option, write_json


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `profile` subcommand."""
    p = subparsers.add_parser("profile", help="forward cost curve t(N)/t(1) and projected speedup",
                              description=profile.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    p.add_argument("--config", default=None, choices=sorted(profile.CONFIGS),
                   help="instead of --model: a Llama-shaped model with random weights")
    p.add_argument("--context", type=int, default=512, help="KV cache length before the timed forward")
    p.add_argument("--sizes", default=",".join(map(str, profile.DEFAULT_SIZES)),
                   help="query token counts N, comma list")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per N (the median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds over all N first")
    p.add_argument("--mean-accepted", type=float, default=None, metavar="X",
                   help="mean accepted tokens per step measured with a real model (for the projection)")
    p.add_argument("--tree-nodes", type=float, default=81,
                   help="draft tree size N for --mean-accepted (default 81: the 80-node 2.2.2 tree plus its root)")
    p.add_argument("--bench-json", default=None, metavar="FILE",
                   help="take mean accepted and tree sizes from a bench JSON")
    threads_option(p)
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the curve and projections as JSON")
    p.set_defaults(func=run)
    return p


def validate(args: argparse.Namespace) -> tuple[list[int], dict | None]:
    """(sizes, bench methods) from the arguments; raises ProfileInputError before any model is touched."""
    sizes = profile.parse_sizes(args.sizes)
    if args.context < 1 or args.repeats < 1 or args.warmup < 0:
        raise profile.ProfileInputError("--context and --repeats must be >= 1, --warmup >= 0")
    if args.model and args.config:
        raise profile.ProfileInputError("give --model or --config, not both")
    if args.mean_accepted is not None and not args.mean_accepted >= 1:
        raise profile.ProfileInputError(f"--mean-accepted must be >= 1, got {args.mean_accepted}")
    if args.tree_nodes < 1:
        raise profile.ProfileInputError(f"--tree-nodes must be >= 1, got {args.tree_nodes}")
    bench = profile.read_bench_json(args.bench_json) if args.bench_json else None
    if problem := output_problem(args.json, "--json"):
        raise profile.ProfileInputError(problem)
    return sizes, bench


def run(args: argparse.Namespace) -> int:
    """Validate, build or load the model, time the forwards, print the curve and projections."""
    try:
        sizes, bench = validate(args)
    except profile.ProfileInputError as exc:
        return report_error(exc, 2)
    torch.set_grad_enabled(False)
    apply_threads(args.threads)
    try:
        if args.config:
            device = check_device(args.device)
            model = profile.build_random_model(args.config, device, parse_dtype(args.dtype, device))
            name = f"{args.config} (random weights)"
        else:
            model, _ = load_model(args.model, device=args.device, dtype=args.dtype)
            name, device = args.model or "SmolLM2-135M-Instruct (embedded)", next(model.parameters()).device
    except (RuntimeError, ValueError, OSError) as exc:
        return report_error(exc, 2 if args.config else 1)
    meta = profile.run_meta(args, model, name, device)
    print(f"profile: {meta['model']} on {meta['device']} ({meta['machine']}), {meta['dtype']}", file=sys.stderr)
    meta["linear"] = profile.tune_linears(model, args.context) if args.linear == "auto" else describe_plan(model)
    print(meta["linear"]["summary"], file=sys.stderr)
    curve = profile.summarize(profile.measure_curve(model, sizes, args.context, args.repeats, args.warmup))
    rows = profile.projections(curve, args.mean_accepted, bench, args.tree_nodes)
    print(profile.format_report(meta, curve, rows))
    if args.json:
        write_json(args.json, {**meta, "curve": {str(n): c for n, c in curve.items()}, "projections": rows})
    return 0
