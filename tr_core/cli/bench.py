"""`python -m tr_core bench`: its options, their checks before any model is loaded, and the run (measured by
tr_core/bench/bench.py or concurrency.py, made a JSON document by results.py and tables by tables.py)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from tqdm.auto import tqdm

from ..bench import bench, concurrency, results, tables
from ..bench.questions import QuestionFileError
from ..config import DecodeConfigError
from ..kernels import describe_plan
from ..models import default_device
from ..tree import default_template, template_problem
from .options import (add_model_options, add_sampling_options, apply_warm_start, decode_config, load_model_or_report,
                      output_problem, report_error, threads_option, warm_start_option, write_json)


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand."""
    p = subparsers.add_parser(
        "bench", help="benchmark Token Recycling against plain decoding, transformers generate and PLD",
        description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", action="append", required=True, metavar="FILE.jsonl",
                   help="question file (JSON lines with question_id, category, turns); repeat for several")
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--per-task", type=int, default=None, metavar="N",
                   help="take the first N questions of each task (file order), round-robin over tasks")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="then keep only the first N questions")
    p.add_argument("--methods", default="vanilla,recycling,hf,pld",
                   help="comma list of vanilla, recycling, recycling[TEMPLATE], hf, pld (vanilla is always run)")
    p.add_argument("--template", default=None,
                   help="draft tree template(s) for `recycling`, comma list; several give recycling[T] each "
                        "(default: the device's default, as in the app: hybrid on a CPU, 2.2.2 on a GPU)")
    add_sampling_options(p)
    p.add_argument("--fresh-matrix", action="store_true",
                   help="reset the adjacency matrix before every question (to the warm start's, or empty)")
    p.add_argument("--fresh-sessions", action="store_true",
                   help="answer only each question's first turn, every method from a new session's state (the warm "
                        "start or empty; the drafters' starting calibration): what a new visitor's first answer gets")
    warm_start_option(p)
    p.add_argument("--topk-candidates", type=int, default=8, help="candidates per adjacency matrix row (k)")
    p.add_argument("--pld-tokens", type=int, default=10, help="pld: prompt_lookup_num_tokens")
    p.add_argument("--pld-ngram", type=int, default=2, help="pld: max_matching_ngram_size")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="warm-up questions (short answers, discarded)")
    p.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="answer every turn in R rounds of all methods, each from the same learned state, and keep "
                        "each method's fastest time: a busy machine's slow spells then hit few answers")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="answer every question's first turn N at once (tr_core.batch) and one after another, "
                        "interleaved per group of N, with plain decoding and transformers' generate batched the same "
                        "way: throughputs, ratios and whether every answer is the same batched and alone")
    threads_option(p)
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the results as JSON")
    p.add_argument("--max-minutes", type=float, default=None, metavar="M",
                   help="start no new question after M minutes; results cover the questions completed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def validate_args(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """Check every input before any model is loaded; return the selected questions and the methods."""
    try:
        decode_config(args)
    except DecodeConfigError as exc:
        raise bench.BenchInputError(exc.as_option()) from None
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise bench.BenchInputError(f"--max-minutes must be > 0, got {args.max_minutes}")
    floors = {"--warmup": (args.warmup, 0), "--repeats": (args.repeats, 1), "--concurrency": (args.concurrency, 1),
              "--topk-candidates": (args.topk_candidates, 1)}
    for option, (value, least) in floors.items():
        if value is not None and value < least:
            raise bench.BenchInputError(f"{option} must be >= {least}, got {value}")
    if args.pld_tokens < 1 or args.pld_ngram < 1:
        raise bench.BenchInputError("--pld-tokens and --pld-ngram must be >= 1")
    if args.concurrency is not None and (args.fresh_matrix or args.fresh_sessions):
        raise bench.BenchInputError("--concurrency answers every first turn from the session's state already: "
                                    "leave out --fresh-matrix and --fresh-sessions")
    if problem := output_problem(args.json, "--json"):
        raise bench.BenchInputError(problem)
    if args.template is None:  # the tree the app and `generate` use on this device
        where = str(args.device or default_device())
        args.template = default_template("cuda" if where.startswith("cuda") else "cpu")
    specs = bench.parse_methods(args.methods, args.template)
    for spec in specs:
        if problem := template_problem(spec.template or None, args.topk_candidates):
            raise bench.BenchInputError(problem)
    questions = bench.load_all_questions(args.questions, args.per_task, args.limit)
    return questions, specs


def run(args: argparse.Namespace) -> int:
    """Validate, load the model, warm up, run all methods interleaved, print the tables, write the JSON."""
    try:
        questions, specs = validate_args(args)
    except (QuestionFileError, bench.BenchInputError) as exc:
        return report_error(exc, 2)
    torch.set_grad_enabled(False)
    loaded = load_model_or_report(args)
    if loaded is None:
        return 1
    runner = bench.Runner(*loaded, specs, args, decode_config(args))
    meta = results.run_meta(args, runner.model, runner.device)
    if args.concurrency is not None:
        return run_concurrency(args, runner, questions, specs, meta)
    n_answers = len(questions) if args.fresh_sessions else sum(len(q.turns) for q in questions)
    print(f"bench: {len(questions)} questions ({n_answers} answers) x {len(specs)} methods "
          f"({', '.join(s.name for s in specs)}) on {meta['device']} ({meta['machine']})", file=sys.stderr)
    if args.warmup:
        bench.warm_up(runner, questions, specs, args.warmup)
    skipped: list[dict] = []
    records = measure(args, runner, meta, n_answers * len(specs),
                      lambda bar: bench.run_questions(runner, questions, specs, args, progress=bar, skipped=skipped))
    if records is None:
        return 1
    return report(args, results.build_result(records, specs, questions, meta, skipped))


def run_concurrency(args: argparse.Namespace, runner: bench.Runner, questions: list[Any], specs: list[Any],
                    meta: dict[str, Any]) -> int:
    """`--concurrency N`: the first turns in groups of N, each way interleaved per group (bench/concurrency.py)."""
    load = {"before": concurrency.load_average()}
    skipped: list[dict] = []
    prompts = concurrency.first_turns(runner, questions, args.max_new_tokens, skipped)
    groups = [prompts[i:i + args.concurrency] for i in range(0, len(prompts), args.concurrency)]
    ways = concurrency.ways_of(specs)
    for note in concurrency.left_out(specs):
        print(f"bench: left out: {note}", file=sys.stderr)
    print(f"bench: {len(prompts)} first turns, {args.concurrency} at once ({len(groups)} groups) x {len(ways)} ways "
          f"({', '.join(w.name for w in ways)}) on {meta['device']} ({meta['machine']})", file=sys.stderr)
    if args.warmup and groups:
        concurrency.warm_up(runner, groups[0], ways)
    records = measure(args, runner, meta, len(prompts) * len(ways) * args.repeats,
                      lambda bar: concurrency.run_groups(runner, groups, ways, args, bar))
    if records is None:
        return 1
    load["after"] = concurrency.load_average()
    return report(args, concurrency.build_result(records, ways, questions, meta, skipped, args.concurrency, load,
                                                 concurrency.left_out(specs)))


def measure(args: argparse.Namespace, runner: bench.Runner, meta: dict[str, Any], total: int,
            answer: Callable[[Any], list]) -> list | None:
    """Start every engine's session as `--warm-start` says, then `answer(progress bar of `total` answers)`; `meta`
    records the warm start and how the linear layers multiplied. None after reporting an unfit warm-start file."""
    try:
        runner.start_sessions(lambda engine: apply_warm_start(args.warm_start, engine, args.model))
    except ValueError as exc:
        report_error(exc, 1)
        return None
    info = runner.warm
    meta["warm_start"] = {"option": args.warm_start, **(asdict(info) if info is not None else {}),
                          "described": info.describe() if info is not None else "cold (empty matrix)"}
    with tqdm(total=total, desc="bench", unit="answer", file=sys.stderr, disable=args.no_progress,
              mininterval=2.0) as bar:
        records = answer(bar)
    meta["linear"] = describe_plan(runner.model)
    print(meta["linear"]["summary"], file=sys.stderr)
    return records


def report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    """Print the run's header and tables; write its JSON where `--json` says."""
    print(tables.format_header(result) + "\n\n" + tables.format_tables(result))
    if args.json:
        write_json(args.json, result)
    return 0
