"""`python -m tr_core generate`: answer one prompt, streaming the text, then a summary (and the matrix, the trace)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import torch

from ..config import DecodeConfig, DecodeConfigError
from ..engine import Engine
from ..events import StepEvent
from ..kernels import needs_tuning, plan_of
from ..models import EMBEDDED_NAME
from ..trace import TextAssembler, Trace
from ..tree import default_template, template_problem
from .options import (add_decode_options, apply_warm_start, decode_config, load_model_or_report, output_problem,
                      report_error, warm_start_option)

SUMMARY_FIELDS = ("steps", "mean_accepted", "tokens_per_s", "new_tokens", "stop_reason", "method", "template",
                  "overhead_ms", "forward_ms", "prompt_tokens", "prefill_s", "decode_s", "wall_s")  # in --json


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `generate` subcommand."""
    gen = subparsers.add_parser("generate", help="answer one prompt, streaming the text, then print a summary")
    gen.add_argument("--prompt", required=True, help="the user message (chat template applied when the model has one)")
    gen.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    add_decode_options(gen)
    gen.add_argument("--plain", action="store_true", help="plain decoding (one token per step), same harness")
    gen.add_argument("--json", action="store_true", help="print one JSON object (tokens, summary) instead of text")
    warm_start_option(gen)
    gen.add_argument("--load-matrix", default=None,
                     help="start from an adjacency matrix saved earlier (replaces the warm start's matrix)")
    gen.add_argument("--save-matrix", default=None, help="save the adjacency matrix after answering")
    gen.add_argument("--trace", default=None, metavar="FILE.json",
                     help="save the answer's trace: every step's tree, verdict and matrix rows, as JSON (`python -m "
                          "present replay FILE.json OUT.html` turns it into a self-contained HTML replay)")
    gen.set_defaults(func=run)
    return gen


def _prepared_engine(args: argparse.Namespace, cfg: Any) -> tuple[Any, Any] | int:
    """(engine with its warm start and --load-matrix, config with the device's default tree), or an exit code."""
    loaded = load_model_or_report(args)
    if loaded is None:
        return 1
    model, tokenizer = loaded
    engine = Engine(model, tokenizer, topk_candidates=args.topk_candidates, tune_kernels=args.linear == "auto")
    if args.template is None:
        cfg = cfg.with_(template=default_template(engine.device))
        if not args.plain and (problem := template_problem(cfg.template, args.topk_candidates)):
            return report_error(problem, 2)
    try:
        if not args.plain:
            apply_warm_start(args.warm_start, engine, args.model)
        if args.load_matrix:
            engine.matrix.load(args.load_matrix)
    except ValueError as exc:
        return report_error(exc, 1)
    return engine, cfg


def run(args: argparse.Namespace) -> int:
    """Answer one prompt, streaming the text; then the summary, and the matrix and trace when asked for."""
    if not args.prompt.strip():
        return report_error("--prompt is empty", 2)
    for path, option in ((args.save_matrix, "--save-matrix"), (args.trace, "--trace")):
        if problem := output_problem(path, option):
            return report_error(problem, 2)
    try:
        cfg = decode_config(args, template=args.template or "2.2.2", plain=args.plain,
                            provenance=bool(args.trace))  # a trace's replay shows each step under the microscope
    except DecodeConfigError as exc:
        return report_error(exc.as_option(), 2)
    if not args.plain and (problem := template_problem(args.template, args.topk_candidates)):
        return report_error(problem, 2)
    prepared = _prepared_engine(args, cfg)
    if isinstance(prepared, int):
        return prepared
    engine, cfg = prepared
    ids = (engine.tokenizer(args.prompt)["input_ids"] if args.raw
           else engine.encode_chat([{"role": "user", "content": args.prompt}]))
    try:
        engine.check_prompt(ids)
    except ValueError as exc:
        return report_error(exc, 2)
    choosing = engine.tune_kernels and needs_tuning(engine.model, engine.device)
    if engine.times_forwards_first(cfg):
        print("timing this machine's forwards before the first token (seconds for a small model, about 30 s for a "
              "0.5B one on 2 cores; the matrix products' choice is taken from an earlier run instead where a steady "
              "one was kept and still holds)", file=sys.stderr)
    steps, summary, text = _stream(args, engine, ids, cfg)
    if choosing and (plan := plan_of(engine.model)) is not None:  # what this run did, not what it would do
        print(f"matrix products: {plan.origin}", file=sys.stderr)
    _print_summary(args, engine, summary)
    if args.save_matrix:
        try:
            engine.matrix.save(args.save_matrix)
        except OSError as exc:
            return report_error(f"cannot save the matrix: {exc}", 1)
    if args.trace:
        return _write_trace(args, engine, cfg, Trace(steps=steps, summary=summary, step_texts=text.step_texts()))
    return 0


def _stream(args: argparse.Namespace, engine: Any, ids: list[int], cfg: Any) -> tuple[list, Any, Any]:
    """Decode, writing the text as it comes (not with --json); (step events, summary, the text assembler)."""
    text = TextAssembler(engine.decode)
    steps, summary = [], None
    for ev in engine.generate(ids, cfg):
        if isinstance(ev, StepEvent):
            steps.append(ev)
            if not args.json or args.trace:
                text.push(ev.emitted)
            if not args.json:
                print(text.unshown(), end="", flush=True)
        else:
            summary = ev
    if not args.json:
        print(text.unshown(final=True), end="", flush=True)
    return steps, summary, text


def _print_summary(args: argparse.Namespace, engine: Any, summary: Any) -> None:
    """The end of `generate`: one JSON object (`--json`), else a line about the run on stderr."""
    if args.json:
        print(json.dumps({"tokens": summary.tokens, "text": engine.decode(summary.tokens),
                          **{name: getattr(summary, name) for name in SUMMARY_FIELDS},
                          "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", "")}))
    else:
        method = "plain decoding" if args.plain else f"Token Recycling ({summary.template})"
        print(f"\n\n--- {method}: {summary.new_tokens} tokens in {summary.steps} steps, "
              f"{summary.mean_accepted:.2f} tokens/step, {summary.tokens_per_s:.1f} tokens/s, "
              f"engine overhead {summary.overhead_ms:.2f} ms/step vs forward {summary.forward_ms:.1f} ms/step "
              f"({torch.device(engine.device)}, stop: {summary.stop_reason})", file=sys.stderr)


def _write_trace(args: argparse.Namespace, engine: Any, cfg: DecodeConfig, trace: Any) -> int:
    """Save the answer's trace as JSON (`--trace`); return 0, or 1 after an error."""
    trace.model = args.model or f"{EMBEDDED_NAME} (embedded)"
    trace.settings = dict(dataclasses.asdict(cfg), k=args.topk_candidates)
    trace.messages = [{"role": "user", "content": args.prompt}]
    trace.record_texts(engine.token_text)
    try:
        trace.save(args.trace)
    except OSError as exc:
        return report_error(f"cannot write the trace: {exc}", 1)
    print(f"trace saved to {args.trace} ({len(trace.steps)} steps)", file=sys.stderr)
    return 0
