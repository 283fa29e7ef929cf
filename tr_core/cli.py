"""Command line: `python -m tr_core generate|bench|profile ...`."""
from __future__ import annotations

import argparse
import json
import sys

from .tree import TEMPLATE_NAMES, default_template


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _template(text: str) -> str:
    if text not in TEMPLATE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown template {text!r}; choose from {', '.join(TEMPLATE_NAMES)}")
    return text


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that decodes."""
    p.add_argument("--model", default=None, help="hub id, local folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--template", type=_template, default=None,
                   help=f"draft tree: {', '.join(TEMPLATE_NAMES)} (default: 2.2.2 on a GPU, adaptive on a CPU)")
    p.add_argument("--topk-candidates", type=_positive_int, default=8, help="k, candidates per adjacency-matrix row")


def _generate(args: argparse.Namespace) -> int:
    import torch

    from .config import DecodeConfig
    from .engine import Engine
    from .events import StepEvent
    from .models import ModelLoadError, load_model

    if not args.prompt.strip():
        print("error: --prompt is empty", file=sys.stderr)
        return 2
    try:
        cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                           top_k=args.top_k, seed=args.seed, template=args.template or "2.2.2", plain=args.plain)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_model(args.model, args.device, args.dtype)
    except (ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    engine = Engine(model, tokenizer, topk_candidates=args.topk_candidates)
    if args.template is None:
        cfg = cfg.with_(template=default_template(engine.device))
    if args.load_matrix:
        try:
            engine.matrix.load(args.load_matrix)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    ids = engine.encode_chat([{"role": "user", "content": args.prompt}]) if not args.raw else tokenizer(args.prompt)["input_ids"]
    out: list[int] = []
    shown = ""
    summary = None
    for ev in engine.generate(ids, cfg):
        if isinstance(ev, StepEvent):
            out.extend(ev.emitted)
            if not args.json:
                text = engine.decode(out)
                if text.startswith(shown):  # stream only the new, stable suffix
                    sys.stdout.write(text[len(shown):])
                    sys.stdout.flush()
                    shown = text
        else:
            summary = ev
    if args.save_matrix:
        engine.matrix.save(args.save_matrix)
    if args.json:
        print(json.dumps({"tokens": summary.tokens, "text": engine.decode(summary.tokens), "steps": summary.steps,
                          "mean_accepted": summary.mean_accepted, "tokens_per_s": summary.tokens_per_s,
                          "new_tokens": summary.new_tokens, "stop_reason": summary.stop_reason,
                          "method": summary.method, "template": summary.template,
                          "overhead_ms": summary.overhead_ms, "forward_ms": summary.forward_ms,
                          "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", "")}))
    else:
        method = "plain decoding" if args.plain else f"Token Recycling ({summary.template})"
        print(f"\n\n--- {method}: {summary.new_tokens} tokens in {summary.steps} steps, "
              f"{summary.mean_accepted:.2f} tokens/step, {summary.tokens_per_s:.1f} tokens/s, "
              f"engine overhead {summary.overhead_ms:.2f} ms/step vs forward {summary.forward_ms:.1f} ms/step "
              f"({torch.device(engine.device)}, stop: {summary.stop_reason})", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="python -m tr_core", description="Token Recycling speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="answer one prompt, streaming the text, then print a summary")
    gen.add_argument("--prompt", required=True, help="the user message (chat template applied when the model has one)")
    gen.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    add_decode_options(gen)
    gen.add_argument("--plain", action="store_true", help="plain decoding (one token per step), same harness")
    gen.add_argument("--json", action="store_true", help="print one JSON object (tokens, summary) instead of text")
    gen.add_argument("--load-matrix", default=None, help="start from an adjacency matrix saved earlier")
    gen.add_argument("--save-matrix", default=None, help="save the adjacency matrix after answering")
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
