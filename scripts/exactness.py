"""Exact in every dtype? Token Recycling against plain decoding, with and without exact mode, and the library's
`custom_generate` against stock `generate` (beside transformers' prompt lookup), on unseen questions.

    python scripts/exactness.py --dtype bfloat16 --json bench/results/xeon-2t-exactness.json
    python scripts/exactness.py --dtype float32 --no-inexact    # the engine in float32 (exact mode off there)

Per question (the first turn of 5 per Spec-Bench task and 5 MBPP tasks, the warm start's matrix for each
answer): the engine's Token Recycling and its own plain decoding, in exact mode and not, taking turns so that both
modes meet the same machine; then stock `generate`, `generate(custom_generate=tr_core.hf.generate)` and prompt
lookup. Prints one JSON: identical counts, tokens/s of each, and every divergence explained (tr_core.divergence).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tr_core import kernels, warm  # noqa: E402
from tr_core.bench.questions import load_questions, select_questions  # noqa: E402
from tr_core.config import DecodeConfig  # noqa: E402
from tr_core.divergence import explain  # noqa: E402
from tr_core.engine import Engine  # noqa: E402
from tr_core.invariant import LOW_PRECISION  # noqa: E402
from tr_core.machine import describe as machine_name  # noqa: E402
from tr_core.models import load_model  # noqa: E402


def questions(per_task: int) -> list[str]:
    spec = select_questions(load_questions(ROOT / "bench/data/spec_bench_dev.jsonl"), per_task=per_task)
    code = load_questions(ROOT / "bench/data/mbpp_dev.jsonl")[:per_task]
    return [q.turns[0] for q in spec + code]


class Mode:
    """One way of running the model's products: its engine (warm-started), its plan, and its tallies."""

    def __init__(self, name: str, model, tokenizer, exact: bool, warm_name: str) -> None:
        self.name, self.exact = name, exact
        self.engine = Engine(model, tokenizer, exact=exact)
        warm.warm_start(self.engine, warm_name, learn=False)
        self.start = self.engine.snapshot()
        self.plan = kernels.plan_of(model)
        self.tally = {"identical": 0, "answers": 0, "tr_tokens": 0, "tr_s": 0.0, "plain_tokens": 0, "plain_s": 0.0,
                      "divergences": []}

    def answer(self, ids: list[int], cfg: DecodeConfig) -> tuple[list[int], float]:
        if self.plan is not None:
            kernels.set_plan(self.engine.model, self.plan)  # this mode's products (the other mode's may be set)
        else:
            kernels.uninstall(self.engine.model)  # its first answer tunes the library's products
        self.engine.restore(self.start)
        out = list(self.engine.generate(ids, cfg))[-1]
        if self.plan is None:
            self.plan = kernels.plan_of(self.engine.model)  # tuned by that first answer
        return out.tokens, out.decode_s

    def run(self, ids: list[int], tokens: int, template: str) -> None:
        tr, tr_s = self.answer(ids, DecodeConfig(max_new_tokens=tokens, template=template))
        plain, plain_s = self.answer(ids, DecodeConfig(max_new_tokens=tokens, plain=True))
        t = self.tally
        t["answers"] += 1
        t["identical"] += tr == plain
        t["tr_tokens"], t["tr_s"] = t["tr_tokens"] + len(tr), t["tr_s"] + tr_s
        t["plain_tokens"], t["plain_s"] = t["plain_tokens"] + len(plain), t["plain_s"] + plain_s
        if tr != plain:
            why = explain(self.engine, ids, tr, plain)
            t["divergences"].append(why.as_data() if why else {"index": min(len(tr), len(plain))})

    def result(self) -> dict:
        t = dict(self.tally)
        t["tr_tokens_per_s"] = t["tr_tokens"] / t["tr_s"] if t["tr_s"] else None
        t["plain_tokens_per_s"] = t["plain_tokens"] / t["plain_s"] if t["plain_s"] else None
        if t["tr_tokens_per_s"] and t["plain_tokens_per_s"]:
            t["speedup_over_plain"] = t["tr_tokens_per_s"] / t["plain_tokens_per_s"]
        if self.plan is not None:
            kernels.set_plan(self.engine.model, self.plan)
        t["products"] = kernels.describe_plan(self.engine.model)["summary"]
        return t


def stock_comparison(model, tokenizer, prompts: list[list[int]], tokens: int) -> dict:
    """How often `custom_generate` and prompt lookup give stock greedy `generate`'s tokens."""
    import tr_core.hf

    same = {"custom_generate": 0, "prompt_lookup": 0}
    for ids in prompts:
        x = torch.tensor([ids], device=model.device)
        kw = dict(max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        stock = model.generate(x, **kw)[0, len(ids):].tolist()
        same["custom_generate"] += model.generate(x, custom_generate=tr_core.hf.generate, **kw)[0, len(ids):].tolist() == stock
        same["prompt_lookup"] += model.generate(x, prompt_lookup_num_tokens=10, **kw)[0, len(ids):].tolist() == stock
    return {**same, "answers": len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--per-task", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--template", default="hybrid")
    ap.add_argument("--no-inexact", action="store_true", help="only the default mode of this dtype")
    ap.add_argument("--no-stock", action="store_true", help="skip the comparison with stock generate")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model, args.device, args.dtype)
    name = args.model or "embedded"
    default_exact = model.dtype in LOW_PRECISION
    modes = [Mode("exact" if default_exact else "default", model, tokenizer, default_exact, name)]
    if not args.no_inexact and default_exact:
        modes.append(Mode("inexact (exact mode off)", model, tokenizer, False, name))
    prompts = [modes[0].engine.encode_chat([{"role": "user", "content": q}]) for q in questions(args.per_task)]
    began = time.time()
    for i, ids in enumerate(prompts):
        for mode in modes if i % 2 == 0 else modes[::-1]:  # each goes first in turn
            mode.run(ids, args.tokens, args.template)
        print(f"{i + 1}/{len(prompts)}: " + "; ".join(f"{m.name} {m.tally['identical']}" for m in modes),
              file=sys.stderr, flush=True)
    result = {"what": "scripts/exactness.py", "machine": machine_name(model.device), "torch": torch.__version__,
              "model": name, "dtype": args.dtype, "questions": len(prompts), "tokens": args.tokens,
              "template": args.template, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began)),
              "threads": torch.get_num_threads(), "platform": platform.machine(),
              "modes": {m.name: m.result() for m in modes}}
    if not args.no_stock:
        kernels.use_exact(model, default_exact)
        result["stock_generate"] = stock_comparison(model, tokenizer, prompts, args.tokens)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
