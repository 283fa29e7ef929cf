"""Benchmark Token Recycling inside vLLM against plain vLLM and vLLM's own speculative methods, interleaved.

    python -m tr_core.vllm.bench --questions bench/data/spec_bench_dev.jsonl --questions bench/data/mbpp_dev.jsonl

Every method gets its own vLLM engine, all built before timing starts; then each round runs every method on the same
questions, in rotating order, at each concurrency (1: one request at a time; 8: eight at once), so a busy moment of
the machine falls on all methods alike. Reported per method and concurrency: tokens/s (generated tokens over wall
time, best and median of the rounds), mean accepted tokens per step (generated tokens over model steps per
request, steps without a draft included), drafted and accepted tokens, and how many greedy answers are identical
to plain vLLM's. `--studio` adds the library's own one-at-a-time engine on the same questions for comparison.
Runs in vLLM's environment (see docs/vllm.md); nothing here is imported by tr_core.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

METHODS = {
    "plain": None,
    "ngram": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix"},
    "token-recycling": {"method": "custom_class", "model": "tr_core.vllm.TokenRecyclingProposer"},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tr_core.vllm.bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a model folder or hub id (default: the embedded model, converted once)")
    p.add_argument("--questions", action="append", required=True, help="a .jsonl question file (repeatable)")
    p.add_argument("--per-task", type=int, default=2, help="questions per task category (default 2)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--draft", type=int, default=6, help="num_speculative_tokens of every speculative method")
    p.add_argument("--methods", nargs="+", default=["plain", "ngram", "token-recycling"], choices=list(METHODS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the first warms the matrix up too")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--studio", action="store_true", help="also time the library's engine, one question at a time")
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args(argv)


def load_prompts(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """The first turn of `per_task` questions of each task, as chat messages."""
    from tr_core.bench.questions import load_questions, select_questions

    questions = []
    for path in args.questions:
        questions += select_questions(load_questions(path), per_task=args.per_task)
    return [[{"role": "user", "content": q.turns[0]}] for q in questions]


def build_engines(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """One vLLM engine per method (the same model, dtype and limits), built before any timing."""
    from vllm import LLM

    engines = {}
    for name in args.methods:
        spec = METHODS[name] and {**METHODS[name], "num_speculative_tokens": args.draft}
        print(f"[bench] building the {name} engine", file=sys.stderr, flush=True)
        engines[name] = LLM(model=model, dtype=args.dtype, max_model_len=2048, seed=0, enforce_eager=True,
                            speculative_config=spec, disable_log_stats=False)
    return engines


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's cumulative speculative-decoding counters of this engine (zeros without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = {v: 0.0 for v in names.values()}
    for metric in llm.get_metrics():
        if metric.name in names:
            counts[names[metric.name]] = float(metric.value)
    return counts


def run_batch(llm: Any, prompts: list, concurrency: int, max_tokens: int) -> tuple[float, list[list[int]]]:
    """Answer every prompt, `concurrency` at a time, greedily. Returns (seconds, token ids per prompt)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    answers: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        out = llm.chat(prompts[i: i + concurrency], params, use_tqdm=False)
        answers += [list(o.outputs[0].token_ids) for o in out]
    return time.perf_counter() - start, answers


def measure(engines: dict[str, Any], prompts: list, args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds; per (method, concurrency): seconds per round, counters of the last round, answers."""
    results: dict[str, Any] = {}
    names = list(engines)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for concurrency in args.concurrency:
            for name in order:
                before = spec_counters(engines[name])
                seconds, answers = run_batch(engines[name], prompts, concurrency, args.max_tokens)
                after = spec_counters(engines[name])
                cell = results.setdefault(f"{name}@{concurrency}", {"method": name, "concurrency": concurrency,
                                                                     "seconds": []})
                cell["seconds"].append(seconds)
                cell["answers"] = answers
                cell["counters"] = {k: after[k] - before[k] for k in after}
                print(f"[bench] round {r + 1} {name} x{concurrency}: {seconds:.1f}s", file=sys.stderr, flush=True)
    return results


def summarise(cell: dict[str, Any], plain: dict[str, Any] | None) -> dict[str, Any]:
    """The reported figures of one (method, concurrency), from the rounds after the first."""
    tokens = sum(len(a) for a in cell["answers"])
    timed = cell["seconds"][1:] or cell["seconds"]
    accepted = cell["counters"]["accepted"]
    same = sum(a == b for a, b in zip(cell["answers"], plain["answers"])) if plain else None
    return {"method": cell["method"], "concurrency": cell["concurrency"], "tokens": tokens,
            "tok_s_best": tokens / min(timed), "tok_s_median": tokens / statistics.median(timed),
            "seconds": cell["seconds"], "drafted": cell["counters"]["drafted"], "accepted": accepted,
            "tokens_per_step": tokens / max(tokens - accepted, 1),
            "identical": same, "answers": len(cell["answers"])}


def studio_engine(name: str | None, model_dir: str, prompts: list, max_tokens: int, rounds: int) -> dict[str, Any]:
    """The library's Engine (the CPU's default drafting, warm start), one question at a time, greedy."""
    import torch

    from tr_core import DecodeConfig, Engine, StepEvent
    from tr_core.models import load_model
    from tr_core.tree import default_template
    from tr_core.warm import warm_start

    model, tokenizer = load_model(model_dir, dtype=torch.float32)
    engine = Engine(model, tokenizer)
    warm_start(engine, name)  # None: the embedded model's shipped warm start
    cfg = DecodeConfig(max_new_tokens=max_tokens, template=default_template(torch.device("cpu")))
    times, tokens, steps = [], 0, 0
    for _ in range(rounds):
        start, tokens, steps = time.perf_counter(), 0, 0
        for messages in prompts:
            for event in engine.generate(engine.encode_chat(messages), cfg):
                if isinstance(event, StepEvent):
                    tokens, steps = tokens + len(event.emitted), steps + 1
        times.append(time.perf_counter() - start)
    timed = times[1:] or times
    return {"method": f"studio engine ({cfg.template}, one at a time)", "concurrency": 1, "tokens": tokens,
            "tok_s_best": tokens / min(timed), "tok_s_median": tokens / statistics.median(timed), "seconds": times,
            "tokens_per_step": tokens / max(steps, 1)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | concurrency | tok/s (best) | tok/s (median) | tokens/step | drafted | accepted | identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = "" if r.get("identical") is None else f"{r['identical']}/{r['answers']}"
        lines.append(f"| {r['method']} | {r['concurrency']} | {r['tok_s_best']:.1f} | {r['tok_s_median']:.1f} | "
                     f"{r.get('tokens_per_step', 1.0):.2f} | {int(r.get('drafted', 0))} | {int(r.get('accepted', 0))} "
                     f"| {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from tr_core.vllm.models import model_folder

    model = model_folder(args.model)
    prompts = load_prompts(args)
    # the library's engine first: idle vLLM engines keep polling for work and would slow it down
    studio = [studio_engine(args.model, model, prompts, args.max_tokens, args.rounds)] if args.studio else []
    engines = build_engines(args, model)
    cells = measure(engines, prompts, args)
    rows = [summarise(cell, cells.get(f"plain@{cell['concurrency']}")) for cell in cells.values()] + studio
    print(table(rows))
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": model, "questions": len(prompts),
                "max_tokens": args.max_tokens, "draft": args.draft, "rounds": args.rounds, "dtype": args.dtype,
                "machine": machine_line()}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


def machine_line() -> str:
    import vllm

    from tr_core.machine import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, vLLM {vllm.__version__}"


if __name__ == "__main__":
    sys.exit(main())
