"""Command line: `python -m tr_core generate|bench|profile ...`."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import DecodeConfig, DecodeConfigError

THREADS_HELP = "CPU threads for torch (default: torch's choice); 1 is far steadier on a busy small machine"


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def check_template(name: str, where: str = "", names: Iterable[str] | None = None) -> str:
    """Return `name` if it is a template the engine accepts (or one of `names`); else raise ValueError listing them."""
    from .tree import TEMPLATE_NAMES

    known = tuple(TEMPLATE_NAMES if names is None else names)
    if name not in known:
        raise ValueError(f"unknown template {name!r}{where}; choose from {', '.join(known)}")
    return name


def template_problem(template: str | None, k: int) -> str | None:
    """Why a static template cannot be drafted with k candidates per matrix row (it names deeper ranks), or None."""
    from .tree import TEMPLATES

    if template not in TEMPLATES:
        return None  # the grown trees take whatever k gives
    need = 1 + max(max(path) for path in TEMPLATES[template])
    if k >= need:
        return None
    return f"--template {template} drafts candidates up to rank {need - 1}, so it needs --topk-candidates >= {need}, got {k}"


def _template(text: str) -> str:
    """argparse type: a known template name (see check_template)."""
    try:
        return check_template(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def threads_option(p: argparse.ArgumentParser, default: int | None = None, help: str = THREADS_HELP) -> None:
    """Add `--threads N` (an int >= 1, refused by argparse otherwise)."""
    p.add_argument("--threads", type=_positive_int, default=default, metavar="N", help=help)


def apply_threads(threads: int | None) -> None:
    """Give torch `threads` CPU threads (None: leave torch's choice)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """`--model`, `--device`, `--dtype`: which model to load, where and in what precision."""
    p.add_argument("--model", default=None, help="hub id, local folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)")
    linear_option(p)


def linear_option(p: argparse.ArgumentParser) -> None:
    """`--linear auto|stock`: how linear layers multiply on a CPU (tr_core/kernels.py)."""
    p.add_argument("--linear", choices=("auto", "stock"), default="auto",
                   help="linear layers on a CPU: auto times the library's product, W @ x^T and oneDNN's once per model "
                        "and takes the fastest for each number of tokens (default); stock keeps the library's")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """`--temperature`, `--top-p`, `--top-k`, `--repetition-penalty`, `--seed` (checked by DecodeConfig)."""
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0; 1.0 = off; above 1 makes tokens already in the text less likely (as in transformers)")
    p.add_argument("--seed", type=int, default=0)


def output_problem(path: str | None, option: str) -> str | None:
    """Why the output file `path` of `option` could not be written, or None; checked before any work is done."""
    if not path:
        return None
    target = Path(path).expanduser()
    if target.is_dir():
        return f"{option}: {path} is a folder, not a file"
    parent = target.resolve().parent
    if not parent.is_dir():
        return f"{option}: folder {parent} does not exist"
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{option}: {path} is not writable"
    return None


def report_error(error: object, code: int) -> int:
    """Print `error: ...` to stderr; return the exit code `code`."""
    print(f"error: {error}", file=sys.stderr)
    return code


def load_model_or_report(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """Apply `--threads`, load (model, tokenizer) of `--model`, `--device`, `--dtype`; None after printing why not."""
    from .models import load_model

    apply_threads(args.threads)
    try:
        return load_model(args.model, device=args.device, dtype=args.dtype)
    except (RuntimeError, ValueError, OSError) as exc:  # ModelLoadError is a RuntimeError
        report_error(exc, 1)
        return None


WARM_START_HELP = ("start the adjacency matrix and the cost-sized trees' calibration warm: auto (default) takes the "
                   "warm start shipped for the embedded model, else the one learned for this model earlier, else "
                   "learns one now from the project's own corpus (once, with a progress bar; cached); off starts "
                   "cold (empty matrix); or the path of a warm-start file")


def warm_start_option(p: argparse.ArgumentParser) -> None:
    """`--warm-start {auto,off,PATH}` (default auto)."""
    p.add_argument("--warm-start", default="auto", metavar="{auto,off,PATH}", help=WARM_START_HELP)


def apply_warm_start(choice: str, engine: Any, model_name: str | None) -> Any:
    """Apply `--warm-start` to an engine and say on stderr what it did; returns the WarmStartInfo (None for off).
    Raises ValueError (warm.WarmStartError) when a file does not fit the model."""
    from . import warm

    if choice == "off":
        return None
    if choice != "auto":
        info = warm.warm_from_file(engine, choice)
    else:
        from tqdm.auto import tqdm

        bar = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc="learning a warm start for this model (once)", unit="answer",
                           file=sys.stderr)
            bar.update(done - bar.n)

        try:
            info = warm.warm_start(engine, model_name, progress=progress)
        finally:
            if bar is not None:
                bar.close()
    print(info.describe(), file=sys.stderr)
    return info


def decode_config(args: argparse.Namespace, **fields: Any) -> DecodeConfig:
    """The DecodeConfig of `--max-new-tokens` and the sampling options, plus `fields`; raises DecodeConfigError."""
    return DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, repetition_penalty=args.repetition_penalty, seed=args.seed, **fields)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that decodes."""
    from .tree import TEMPLATE_NAMES

    add_model_options(p)
    p.add_argument("--max-new-tokens", type=_positive_int, default=256)
    add_sampling_options(p)
    p.add_argument("--template", type=_template, default=None,
                   help=f"draft tree: {', '.join(TEMPLATE_NAMES)} (default: 2.2.2 on a GPU, hybrid on a CPU)")
    p.add_argument("--topk-candidates", type=_positive_int, default=8, help="k, candidates per adjacency-matrix row")
    threads_option(p)


def _prepared_engine(args: argparse.Namespace, cfg: Any) -> tuple[Any, Any] | int:
    """The model loaded into an engine with its warm start (and --load-matrix), and the config with the device's
    default tree; or the exit code after a one-line error."""
    from .engine import Engine
    from .tree import default_template

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


def _generate(args: argparse.Namespace) -> int:
    from .kernels import needs_tuning, plan_of
    from .trace import Trace

    if not args.prompt.strip():
        return report_error("--prompt is empty", 2)
    for path, option in ((args.save_matrix, "--save-matrix"), (args.replay_html, "--replay-html")):
        if problem := output_problem(path, option):
            return report_error(problem, 2)
    try:
        cfg = decode_config(args, template=args.template or "2.2.2", plain=args.plain)
    except DecodeConfigError as exc:
        return report_error(exc.as_option(), 2)
    if not args.plain and (problem := template_problem(args.template, args.topk_candidates)):
        return report_error(problem, 2)
    prepared = _prepared_engine(args, cfg)
    if isinstance(prepared, int):
        return prepared
    engine, cfg = prepared
    tokenizer = engine.tokenizer
    ids = engine.encode_chat([{"role": "user", "content": args.prompt}]) if not args.raw else tokenizer(args.prompt)["input_ids"]
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
    if args.replay_html:
        return _write_replay(args, engine, cfg, Trace(steps=steps, summary=summary, step_texts=text.step_texts()))
    return 0


def _stream(args: argparse.Namespace, engine: Any, ids: list[int], cfg: Any) -> tuple[list, Any, Any]:
    """Decode, writing the text as it comes (not with --json); (step events, summary, the text assembler)."""
    from .events import StepEvent
    from .trace import TextAssembler

    text = TextAssembler(engine.decode)
    steps, summary = [], None
    for ev in engine.generate(ids, cfg):
        if isinstance(ev, StepEvent):
            steps.append(ev)
            if not args.json or args.replay_html:
                text.push(ev.emitted)
            if not args.json:
                _write(text.unshown())
        else:
            summary = ev
    if not args.json:
        _write(text.unshown(final=True))
    return steps, summary, text


def _print_summary(args: argparse.Namespace, engine: Any, summary: Any) -> None:
    """The end of `generate`: one JSON object (`--json`), else a line about the run on stderr."""
    import torch

    if args.json:
        print(json.dumps({"tokens": summary.tokens, "text": engine.decode(summary.tokens), "steps": summary.steps,
                          "mean_accepted": summary.mean_accepted, "tokens_per_s": summary.tokens_per_s,
                          "new_tokens": summary.new_tokens, "stop_reason": summary.stop_reason,
                          "method": summary.method, "template": summary.template,
                          "overhead_ms": summary.overhead_ms, "forward_ms": summary.forward_ms,
                          "prompt_tokens": summary.prompt_tokens, "prefill_s": summary.prefill_s,
                          "decode_s": summary.decode_s, "wall_s": summary.wall_s,
                          "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", "")}))
    else:
        method = "plain decoding" if args.plain else f"Token Recycling ({summary.template})"
        print(f"\n\n--- {method}: {summary.new_tokens} tokens in {summary.steps} steps, "
              f"{summary.mean_accepted:.2f} tokens/step, {summary.tokens_per_s:.1f} tokens/s, "
              f"engine overhead {summary.overhead_ms:.2f} ms/step vs forward {summary.forward_ms:.1f} ms/step "
              f"({torch.device(engine.device)}, stop: {summary.stop_reason})", file=sys.stderr)


def _write_replay(args: argparse.Namespace, engine: Any, cfg: DecodeConfig, trace: Any) -> int:
    """Save the answer's replay as one self-contained HTML file (`--replay-html`); return 0, or 1 after an error."""
    import dataclasses

    from .models import EMBEDDED_NAME
    from .replay import replay_html

    trace.model = args.model or f"{EMBEDDED_NAME} (embedded)"
    trace.settings = dict(dataclasses.asdict(cfg), k=args.topk_candidates)
    trace.messages = [{"role": "user", "content": args.prompt}]
    trace.record_texts(engine.token_text)
    try:
        with open(args.replay_html, "w", encoding="utf-8") as f:
            f.write(replay_html(trace))
    except OSError as exc:
        return report_error(f"cannot write the replay: {exc}", 1)
    print(f"replay saved to {args.replay_html} ({len(trace.steps)} steps)", file=sys.stderr)
    return 0


def _write(text: str) -> None:
    """Print streamed text at once."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def program_name() -> str:
    """How the user started this program, for the usage line: the console script's name or `python -m tr_core`."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    # `python -m tr_core` puts tr_core/__main__.py in argv[0], a name the user never typed
    return "python -m tr_core" if name in ("", "__main__.py", "-c") else name


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog=program_name(), description="Token Recycling speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="answer one prompt, streaming the text, then print a summary")
    gen.add_argument("--prompt", required=True, help="the user message (chat template applied when the model has one)")
    gen.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    add_decode_options(gen)
    gen.add_argument("--plain", action="store_true", help="plain decoding (one token per step), same harness")
    gen.add_argument("--json", action="store_true", help="print one JSON object (tokens, summary) instead of text")
    warm_start_option(gen)
    gen.add_argument("--load-matrix", default=None, help="start from an adjacency matrix saved earlier (replaces the "
                                                         "warm start's matrix)")
    gen.add_argument("--save-matrix", default=None, help="save the adjacency matrix after answering")
    gen.add_argument("--replay-html", default=None, metavar="FILE",
                     help="save the answer as one self-contained HTML replay (works offline, steps through the tree)")
    gen.set_defaults(func=_generate)
    from . import bench, profile

    bench.register(sub)
    profile.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)
