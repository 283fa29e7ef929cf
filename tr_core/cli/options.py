"""The command line's shared options: argparse helpers, checks made before any work, the model and warm start."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import models, warm
from ..config import DecodeConfig
from ..tree import TEMPLATE_NAMES, check_template

THREADS_HELP = "CPU threads for torch (default: torch's choice); 1 is far steadier on a busy small machine"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _template(text: str) -> str:
    try:
        return check_template(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def threads_option(p: argparse.ArgumentParser, default: int | None = None, help: str = THREADS_HELP) -> None:
    p.add_argument("--threads", type=_positive_int, default=default, metavar="N", help=help)


def apply_threads(threads: int | None) -> None:
    """Give torch `threads` CPU threads (None: leave torch's choice)."""
    if threads is not None:
        torch.set_num_threads(threads)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Which model to load, where, in what precision, and how its linear layers multiply on a CPU."""
    p.add_argument("--model", default=None,
                   help="hub id, local folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--linear", choices=("auto", "stock"), default="auto",
                   help="linear layers on a CPU: auto times the library's product, W @ x^T and oneDNN's once per model "
                        "and takes the fastest for each number of tokens (default); stock keeps the library's")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0; 1.0 = off; above 1 makes tokens already in the text less likely (as in transformers)")
    p.add_argument("--seed", type=int, default=0)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=_positive_int, default=256)
    add_sampling_options(p)
    p.add_argument("--template", type=_template, default=None,
                   help=f"draft tree: {', '.join(TEMPLATE_NAMES)} (default: 2.2.2 on a GPU, hybrid on a CPU)")
    p.add_argument("--topk-candidates", type=_positive_int, default=8, help="k, candidates per adjacency-matrix row")
    threads_option(p)


def warm_start_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warm-start", default="auto", metavar="{auto,learn,off,PATH}",
                   help="start the adjacency matrix and the cost-sized trees' calibration warm: auto (default) takes "
                        "the warm start shipped for the embedded model, else the one learned for this model earlier, "
                        "else learns one now from the project's own corpus for at most about 45 s (a partial one, "
                        "from the answers decoded in time; cached); learn does the same but learns the full one "
                        "(minutes; cached, replacing a partial one); off starts cold (empty matrix); or the path of "
                        "a warm-start file")


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


def write_json(path: str, doc: Any) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def report_error(error: object, code: int) -> int:
    """Print `error: ...` to stderr; return the exit code `code`."""
    print(f"error: {error}", file=sys.stderr)
    return code


def load_model_or_report(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """Apply `--threads`, load (model, tokenizer) of `--model`, `--device`, `--dtype`; None after printing why not."""
    apply_threads(args.threads)
    try:
        return models.load_model(args.model, device=args.device, dtype=args.dtype)
    except (RuntimeError, ValueError, OSError) as exc:  # ModelLoadError is a RuntimeError
        report_error(exc, 1)
        return None


def apply_warm_start(choice: str, engine: Any, model_name: str | None) -> Any:
    """Apply `--warm-start`, saying on stderr what it did; the WarmStartInfo (None: off); ValueError on a bad file.
    auto learns within warm.FIRST_ANSWER_BUDGET_S (a partial warm start when time runs out), learn the full one."""
    if choice == "off":
        return None
    if choice not in ("auto", "learn"):
        info = warm.warm_from_file(engine, choice)
    else:
        budget = warm.FIRST_ANSWER_BUDGET_S if choice == "auto" else None
        bars: list[Any] = []  # made at the first report: nothing shows when the warm start is shipped or cached

        def progress(done: int, total: int) -> None:
            if not bars:
                if budget is not None:
                    print(f"No warm start is kept for this model yet: learning a partial one for at most {budget:.0f} "
                          "s before the first answer (`--warm-start learn` learns the full one, once, in minutes).",
                          file=sys.stderr)
                desc = "learning a warm start for this model" + (" (partial)" if budget is not None else " (once)")
                bars.append(tqdm(total=total, desc=desc, unit="step", file=sys.stderr))
            bars[0].update(done - bars[0].n)

        try:
            info = warm.warm_start(engine, model_name, budget_s=budget, progress=progress)
        finally:
            for bar in bars:
                bar.close()
    print(info.describe(), file=sys.stderr)
    if info.partial:
        print(f"(a partial warm start: `--warm-start learn` learns the full one from all {info.of} answers, once, "
              "and caches it for later runs)", file=sys.stderr)
    return info


def decode_config(args: argparse.Namespace, **fields: Any) -> DecodeConfig:
    """The DecodeConfig of `--max-new-tokens` and the sampling options, plus `fields`; raises DecodeConfigError."""
    return DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, repetition_penalty=args.repetition_penalty, seed=args.seed, **fields)
