"""The JSON document of a `python -m tr_core bench` run: the run's metadata, each method's totals and per-task
breakdown (Spec-Bench's definitions: bench.py), one row per answer. tables.py shows it."""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers

from ..machine import describe
from ..runner import GQA_SWITCH
from .bench import BASELINE, MethodSpec, TurnRecord
from .questions import Question, task_sort_key

PLAUSIBLE_SLACK = 1.10  # ratio <= slack x mean accepted tokens per step (slack covers per-step overheads)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def plausible_limit(mean_accepted: float) -> float:
    """The largest speedup a run with this many tokens per step can honestly reach: a tree forward never costs less
    than a one-token forward, so a step emitting `a` tokens is at most `a` times as fast as a plain step."""
    return mean_accepted * PLAUSIBLE_SLACK


def _plausible(speedup: float | None, mean_accepted: float | None) -> bool | None:
    """False when a speedup exceeds plausible_limit (the machine's load changed during the run: the figure is
    noise); None when either number is missing."""
    if speedup is None or mean_accepted is None:
        return None
    return speedup <= plausible_limit(mean_accepted)


def _stats(recs: list[TurnRecord], base: dict[tuple[str, int], TurnRecord]) -> dict[str, Any]:
    """Totals of a set of records, with speedup and identical counts against the baseline records `base`."""
    tokens = sum(r.tokens for r in recs)
    seconds = sum(r.seconds for r in recs)
    steps = None if any(r.steps is None for r in recs) else sum(r.steps for r in recs)
    paired = [(r, base[(r.question, r.turn)]) for r in recs if (r.question, r.turn) in base]
    speedup = ratio(sum(b.seconds for _, b in paired), sum(r.seconds for r, _ in paired))
    mean_accepted = ratio(tokens, steps)
    nodes = ratio(sum(r.tree_nodes for r in recs), steps) if all(r.tree_nodes for r in recs) else None
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": ratio(tokens, seconds), "steps": steps,
            "mean_accepted": mean_accepted, "mean_tree_nodes": nodes, "speedup": speedup,
            "plausible": _plausible(speedup, mean_accepted),
            "identical": sum(r.answer_ids == b.answer_ids for r, b in paired), "compared": len(paired),
            "answers": len(recs)}


def aggregate(records: list[TurnRecord], method_names: list[str]) -> dict[str, dict]:
    """Per-method totals, per-task breakdown and the histogram of tokens emitted per step (the JSON's `methods`)."""
    base = {(r.question, r.turn): r for r in records if r.method == BASELINE}
    out: dict[str, dict] = {}
    for name in method_names:
        mine = [r for r in records if r.method == name]
        tasks = sorted({r.task for r in mine}, key=task_sort_key)
        hist = Counter(n for r in mine for n in r.accepted_lengths)
        out[name] = {**_stats(mine, base), "per_category": {t: _stats([r for r in mine if r.task == t], base)
                                                            for t in tasks},
                     "accepted_histogram": {str(k): hist[k] for k in sorted(hist)}}
    return out


def build_result(records: list[TurnRecord], specs: list[MethodSpec], questions: list[Question],
                 meta: dict[str, Any], skipped: list[dict] = ()) -> dict[str, Any]:
    """The full JSON document: run metadata, the `methods` aggregate, one row per answer and the `skipped` turns.
    Only questions and turns answered count (a `--max-minutes` run may stop early; a turn too long is skipped)."""
    done = {r.question for r in records}
    selected = len(questions)
    questions = [q for q in questions if q.key in done]
    methods = aggregate(records, [s.name for s in specs])
    for s in specs:
        methods[s.name].update(kind=s.kind, template=s.template)
    rows = [{k: v for k, v in asdict(r).items() if k not in ("answer_ids", "accepted_lengths")} for r in records]
    answered = len({(r.question, r.turn) for r in records})
    return {**meta, "questions_selected": selected, "questions": len(questions), "answers": answered,
            "skipped": list(skipped), "question_keys": [q.key for q in questions], "methods": methods,
            "records": rows}


def checkout_commit() -> str:
    """The commit of the git checkout this code runs from, read from .git without a subprocess; '' when there is none
    (an installed package, a worktree)."""
    git = Path(__file__).resolve().parents[2] / ".git"
    try:
        head = (git / "HEAD").read_text(encoding="utf-8").strip()
        if head.startswith("ref: "):
            ref = head[len("ref: "):]
            if (git / ref).exists():
                head = (git / ref).read_text(encoding="utf-8").strip()
            else:  # refs packed by `git gc`: "<sha> <ref>" lines
                packed = (git / "packed-refs").read_text(encoding="utf-8").splitlines()
                head = next((line.split()[0] for line in packed if line.endswith(" " + ref)), "")
    except OSError:
        return ""
    return head[:7]


def environment(model, device) -> dict[str, str]:
    """Where a run measured: the device, the machine, the model's dtype and the torch and transformers versions."""
    return {"device": str(device), "machine": describe(device),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "torch": torch.__version__,
            "transformers": transformers.__version__}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_meta(args: argparse.Namespace, model, device) -> dict[str, Any]:
    """Metadata of the run (the top-level keys of the JSON document, but `questions` and `methods`)."""
    name = Path(args.model).name if args.model else "SmolLM2-135M-Instruct (embedded, Q4_1 GGUF dequantised)"
    return {
        "model": name, **environment(model, device), "date": utc_now(),
        **{k: getattr(args, k) for k in ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
                                         "seed", "template")},
        "fresh_matrix": bool(args.fresh_matrix), "fresh_sessions": bool(args.fresh_sessions),
        **{k: getattr(args, k) for k in ("topk_candidates", "pld_tokens", "pld_ngram", "repeats")},
        "threads": torch.get_num_threads(),
        "sdpa_shared_kv_heads": os.environ.get(GQA_SWITCH) == "1",  # masked attention reads grouped heads (runner.py)
        "commit": checkout_commit(),
        "command": ("python -m tr_core " + shlex.join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py")
                    else shlex.join(sys.argv)),
    }
