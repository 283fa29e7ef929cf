"""Throughput of N prompts at once (tr_core.batch) against the same N one after another, on the embedded model.

    python scripts/batch_speed.py --prompts 8 --tokens 64 --templates adaptive,hybrid,plain

Prints tokens/s for each way and the ratio, and checks that every prompt's tokens are the same both ways."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tr_core import DecodeConfig, Engine, SummaryEvent, load_model  # noqa: E402
from tr_core.batch import generate_batch  # noqa: E402
from tr_core.bench.questions import load_questions  # noqa: E402
from tr_core.warm import warm_start  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--templates", default="adaptive,hybrid,plain")
    ap.add_argument("--questions", default="bench/data/spec_bench_dev.jsonl")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--cold", action="store_true", help="start with an empty matrix (default: the shipped warm start)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(device="cpu", dtype=torch.float32)
    questions = load_questions(Path(args.questions))[: args.prompts]
    base = Engine(model, tok)
    if not args.cold:
        print("warm start:", warm_start(base, None, learn=False))
    prompts = [base.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in questions]
    for template in ("adaptive", "hybrid"):  # time this machine's forwards once, before any clock runs
        list(base.generate(prompts[0], DecodeConfig(max_new_tokens=8, template=template)))
    print(f"{len(prompts)} prompts, {args.tokens} new tokens, {torch.get_num_threads()} threads")
    for template in args.templates.split(","):
        cfg = DecodeConfig(max_new_tokens=args.tokens, template=template if template != "plain" else "2.2.2",
                           plain=template == "plain")
        t0 = time.perf_counter()
        alone = [list(base.fork().generate(p, cfg))[-1].tokens for p in prompts]
        t_alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        together = {i: ev.tokens for i, ev in generate_batch(base, prompts, cfg, max_rows=len(prompts))
                    if isinstance(ev, SummaryEvent)}
        t_batch = time.perf_counter() - t0
        n = sum(len(t) for t in alone)
        same = all(together[i] == alone[i] for i in range(len(prompts)))
        print(f"{template:10s} one after another {n / t_alone:7.1f} tok/s   batched {n / t_batch:7.1f} tok/s   "
              f"ratio {t_alone / t_batch:5.2f}   identical {same}")


if __name__ == "__main__":
    main()
