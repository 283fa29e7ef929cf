"""Per-step diagnostics of the cost-sized trees: realised rate by chosen draft size, against plain decoding.

    python scripts/step_diagnostics.py THREADS TEMPLATES PER_TASK MAX_NEW
    python scripts/step_diagnostics.py 1 adaptive,hybrid 1 96

For the first PER_TASK questions of each development task (first turn only), every template and plain decoding
answer in turn, each with its own engine. Prints each task's speedup and mean accepted tokens, then, per template
and chosen draft size m, the steps' emitted tokens, median step and forward time, engine overhead, and the rate
relative to a plain step (emitted / step ms x plain step ms): a size whose rate is below 1 lost time when chosen.
This is how the winner's curse, the optimistic costs of never-tried sizes and the zero-draft overhead were found
(docs/cpu-policy.md). Timings are this machine's and noisy: compare rows of one run.
"""
import collections
import statistics as st
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tr_core import DecodeConfig, Engine  # noqa: E402
from tr_core.models import load_model  # noqa: E402
from tr_core.bench.questions import load_questions, task_of  # noqa: E402

DATA = ROOT / "bench" / "data"


def questions(per_task: int, skip: int = 0) -> dict:
    """task -> its development questions number skip + 1 .. skip + per_task (Spec-Bench, then MBPP)."""
    by_task, seen = collections.defaultdict(list), collections.Counter()
    for name in ("spec_bench_dev.jsonl", "mbpp_dev.jsonl"):
        for q in load_questions(DATA / name):
            task = task_of(q.category)
            seen[task] += 1
            if skip < seen[task] <= skip + per_task:
                by_task[task].append(q)
    return by_task


def run(threads: int, templates: list[str], per_task: int, max_new: int) -> None:
    torch.set_num_threads(threads)
    model, tok = load_model(None)
    engines = {t: Engine(model, tok) for t in ["plain", *templates]}
    per_answer = collections.defaultdict(lambda: collections.defaultdict(list))
    per_size = collections.defaultdict(list)
    for task, items in questions(per_task).items():
        for q in items:
            ids = engines["plain"].encode_chat([{"role": "user", "content": q.turns[0]}])
            for t, eng in engines.items():
                cfg = DecodeConfig(max_new_tokens=max_new, plain=t == "plain", template="2.2.2" if t == "plain" else t)
                events = list(eng.generate(ids, cfg))
                s = events[-1]
                per_answer[task][t].append((s.new_tokens, s.decode_s, s.steps))
                for e in events[:-1]:
                    size = 0 if t == "plain" else min(len(e.tokens) - 1, 20)
                    per_size[(t, size)].append((len(e.emitted), e.timings["total"], e.timings["forward"]))
    report(per_answer, per_size, templates)


def report(per_answer: dict, per_size: dict, templates: list[str]) -> None:
    for task, runs in per_answer.items():
        base = sum(x[0] for x in runs["plain"]) / sum(x[1] for x in runs["plain"])
        cells = []
        for t in templates:
            rate = sum(x[0] for x in runs[t]) / sum(x[1] for x in runs[t])
            cells.append(f"{t}: {rate / base:.2f}x acc {sum(x[0] for x in runs[t]) / sum(x[2] for x in runs[t]):.2f}")
        print(" | ".join([task, *cells]))
    plain_ms = st.median(x[1] for x in per_size[("plain", 0)])
    print(f"plain step median {plain_ms:.1f} ms")
    for key in sorted(k for k in per_size if k[0] != "plain"):
        v = per_size[key]
        emitted, ms = sum(x[0] for x in v) / len(v), st.median(x[1] for x in v)
        fwd = st.median(x[2] for x in v)
        print(f"{key[0]:>14} m={key[1]:>2} n={len(v):4d} emitted {emitted:.2f} step {ms:.1f} ms fwd {fwd:.1f} "
              f"overhead {ms - fwd:.2f} -> rate vs plain {emitted / ms * plain_ms:.2f}")


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]))
