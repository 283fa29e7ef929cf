"""`python -m tr_core bench`: Token Recycling against plain decoding and its peers, Spec-Bench style.

Every method answers the same prompts with the same model and settings, interleaved per question after a warm-up,
so that machine drift hits all alike: `vanilla` (the engine's plain decoding, the baseline of every speedup),
`recycling` (with the `--template` tree; several templates give `recycling[T]` each, each with its own adjacency
matrix, kept across questions unless `--fresh-matrix`, from the model's warm start or empty with `--warm-start off`),
`hf` (transformers' `generate`) and `pld` (its prompt lookup decoding). `--fresh-sessions`: only each question's
first turn, every method from a new session's state. `--concurrency N`: the throughput of N first turns at once
against one after another (tr_core/bench/concurrency.py).

Time is wall time per answer, prefill included (with `--repeats R`, the fastest of R rounds, each from the same
learned state); speedup is vanilla's total seconds over the method's; mean accepted tokens is emitted tokens per
forward (for hf/pld every forward, so plain decoding scores 1.00 either way). Answers are cut after the first stop
token and identical when their ids before it are equal; multi-turn questions are answered turn by turn, each method
with its own earlier answers; `identical`/`compared` count turns.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from .. import warm
from ..config import DecodeConfig
from ..engine import Engine
from ..tree import check_template
from . import answers
from .questions import Question, load_questions, select_questions

METHOD_KINDS = ("vanilla", "recycling", "hf", "pld")
BASELINE = "vanilla"
WARMUP_FALLBACK = "Say hello in one short sentence."


class BenchInputError(ValueError):
    """Bad benchmark input (methods, templates, numbers, paths), found before any model is loaded."""


@dataclass(frozen=True)
class MethodSpec:
    name: str  # e.g. "vanilla", "recycling", "recycling[adaptive]", "hf", "pld"
    kind: str  # one of METHOD_KINDS
    template: str = ""  # recycling only: a name from tree.TEMPLATE_NAMES


@dataclass
class TurnRecord:
    """What one method produced for one turn of one question, and what it cost."""

    method: str
    question: str  # Question.key
    category: str
    task: str
    turn: int  # 0-based
    prompt_tokens: int
    tokens: int  # emitted tokens (stop token included, cut at max_new_tokens)
    seconds: float  # wall time, prefill included (the fastest of its repeats)
    steps: int | None  # decoding forwards (None when unknown)
    answer_ids: list[int] = field(default_factory=list)  # token ids before the first stop token
    accepted_lengths: list[int] = field(default_factory=list)  # tokens emitted by each step (engine methods)
    tree_nodes: int = 0  # draft tree nodes verified, summed over steps, root included (engine methods; 0 = unknown)
    seconds_all: list[float] = field(default_factory=list)  # every repeat's wall time, in the order run


def parse_methods(methods: str, templates: str) -> list[MethodSpec]:
    """`--methods` and `--template` as MethodSpecs, vanilla first (added if missing); raises BenchInputError."""
    tpl_list = [_check_template(t.strip(), "--template") for t in templates.split(",") if t.strip()]
    if not tpl_list:
        raise BenchInputError("--template: give at least one template name")
    specs: list[MethodSpec] = []
    for raw in [m.strip() for m in methods.split(",") if m.strip()]:
        if raw == "recycling":
            specs += [MethodSpec("recycling" if len(tpl_list) == 1 else f"recycling[{t}]", "recycling", t)
                      for t in tpl_list]
        elif raw.startswith("recycling[") and raw.endswith("]"):
            template = _check_template(raw[len("recycling["):-1], "--methods", f" in {raw!r}")
            specs.append(MethodSpec(raw, "recycling", template))
        elif raw in METHOD_KINDS:
            specs.append(MethodSpec(raw, raw))
        else:
            raise BenchInputError(
                f"--methods: unknown method {raw!r}; choose from {', '.join(METHOD_KINDS)} or recycling[TEMPLATE]")
    if not specs:
        raise BenchInputError("--methods: give at least one method")
    names = [s.name for s in specs]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise BenchInputError(f"--methods: method listed twice: {', '.join(dupes)}")
    if BASELINE not in names:
        specs.insert(0, MethodSpec(BASELINE, BASELINE))
    return sorted(specs, key=lambda s: s.name != BASELINE)  # baseline first, others in the given order


def _check_template(name: str, option: str, where: str = "") -> str:
    try:
        return check_template(name, where)
    except ValueError as exc:
        raise BenchInputError(f"{option}: {exc}") from None


def load_all_questions(paths: list[str], per_task: int | None, limit: int | None) -> list[Question]:
    """Load every question file and select deterministically; raises QuestionFileError / BenchInputError."""
    questions = [q for p in paths for q in load_questions(p)]
    first: dict[str, Question] = {}
    for q in questions:
        if (other := first.setdefault(q.key, q)) is not q:
            raise BenchInputError(
                f"two questions are both named {q.key!r} ({other.source}:{other.line} and {q.source}:{q.line}): "
                "the same file given twice, two files of the same name, or ids that differ only as number and text")
    for option, value in (("--per-task", per_task), ("--limit", limit)):
        if value is not None and value < 1:
            raise BenchInputError(f"{option} must be >= 1, got {value}")
    return select_questions(questions, per_task=per_task, limit=limit)


class Runner:
    """Runs each method on one prompt; owns one Engine per engine method (each with its own matrix)."""

    def __init__(self, model, tokenizer, specs: list[MethodSpec], args: argparse.Namespace, base: DecodeConfig) -> None:
        self.model, self.args, self.device = model, args, next(model.parameters()).device
        self.specs = {s.name: s for s in specs}
        engine_specs = [s for s in specs if s.kind in ("vanilla", "recycling")]
        self.engines = {s.name: Engine(model, tokenizer, topk_candidates=args.topk_candidates,
                                       tune_kernels=args.linear == "auto") for s in engine_specs}
        self.configs = {s.name: base.with_(plain=True) if s.kind == "vanilla" else base.with_(template=s.template)
                        for s in engine_specs}
        self.encoder = next(iter(self.engines.values()))  # one chat template and stop set for every method
        self.stop_ids = {int(t) for t in self.encoder.stop_token_ids}
        self.tuned = any(e.tune_kernels for e in self.engines.values())  # the baselines multiply as the engines do
        self.warm: Any = None  # the WarmStartInfo applied to the recycling engines (None: they start cold)
        self.session_starts: dict[str, dict] = {}  # per engine, a new session's state (`start_sessions`)

    def reset_matrices(self) -> None:
        """Forget what the matrices and context indexes learnt: back to the session's start, else empty."""
        for name, engine in self.engines.items():
            engine.forget(to=self.session_starts.get(name))

    def start_sessions(self, warm_start: Callable[[Any], Any]) -> None:
        """Put every engine in a new session's state, the recycling ones warmed by `warm_start` (engine -> its
        WarmStartInfo or None), and keep that state for `fresh_session` and `reset_matrices`."""
        for name, engine in self.engines.items():
            warm.fresh_session(engine)
            if self.specs[name].kind == "recycling" and (info := warm_start(engine)) is not None:
                self.warm = info
            self.session_starts[name] = engine.snapshot()

    def fresh_session(self) -> None:
        for name, start in self.session_starts.items():
            self.engines[name].restore(start)

    def overflow(self, ids: list[int], max_new_tokens: int) -> str:
        """Why a prompt of `ids` and `max_new_tokens` answer tokens overflows the model's context ('' if it fits)."""
        limit = self.encoder.context_limit
        return "" if len(ids) + max_new_tokens <= limit else (
            f"its prompt has {len(ids)} tokens and --max-new-tokens is {max_new_tokens}, more than the model's context "
            f"of {limit} tokens")

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.encoder.encode_chat(messages))

    def answer(self, name: str, ids: list[int], max_new_tokens: int | None = None, seed_offset: int = 0) -> dict:
        """Method `name`'s answer to one prompt (answers.py's dict)."""
        max_new = max_new_tokens or self.args.max_new_tokens
        if name in self.engines:
            return answers.engine_answer(self.engines[name], self.configs[name].with_(max_new_tokens=max_new), ids,
                                         self.stop_ids)
        return answers.transformers_answer(self.model, self.specs[name].kind, ids, max_new, self.stop_ids, self.args,
                                           self.tuned, seed=self.args.seed + seed_offset)


def out_of_time(args: argparse.Namespace, start: float, done: int, total: int, what: str) -> bool:
    """Whether `--max-minutes` has passed since `start` (said on stderr): no new question or group then."""
    if args.max_minutes is None or time.perf_counter() - start <= args.max_minutes * 60:
        return False
    print(f"bench: --max-minutes {args.max_minutes} reached; stopping after {done} of {total} {what}",
          file=sys.stderr)
    return True


def run_questions(runner: Runner, questions: list[Question], specs: list[MethodSpec], args: argparse.Namespace,
                  progress: Any, skipped: list[dict]) -> list[TurnRecord]:
    """Answer every question with every method, interleaved per turn, the order rotating per question; one record
    per turn and method. A turn too long for the model's context goes to `skipped`, with its later turns."""
    records: list[TurnRecord] = []
    names = [s.name for s in specs]
    start = time.perf_counter()
    for qi, q in enumerate(questions):
        if out_of_time(args, start, qi, len(questions), "questions"):
            break
        if args.fresh_sessions:
            runner.fresh_session()
        elif args.fresh_matrix:
            runner.reset_matrices()
        order = names[qi % len(names):] + names[:qi % len(names)]
        histories: dict[str, list[dict[str, str]]] = {name: [] for name in order}
        for ti, turn in enumerate(q.turns[:1] if args.fresh_sessions else q.turns):  # a new session: one answer
            prompts = {}
            for name in order:
                histories[name].append({"role": "user", "content": turn})
                prompts[name] = runner.encode(histories[name])
            if too_long := max(runner.overflow(ids, args.max_new_tokens) for ids in prompts.values()):
                print(f"bench: {q.key} turn {ti + 1} skipped (and any later turns): {too_long}", file=sys.stderr)
                skipped += [{"question": q.key, "turn": t + 1, "reason": too_long} for t in range(ti, len(q.turns))]
                break  # later turns build on this one
            outs = _rounds(runner, order, prompts, args.repeats, seed_offset=qi * 16 + ti)
            for name in order:
                out = outs[name]
                records.append(TurnRecord(
                    method=name, question=q.key, category=q.category, task=q.task, turn=ti,
                    prompt_tokens=len(prompts[name]), tokens=len(out["emitted"]), seconds=out["seconds"],
                    steps=out["steps"], answer_ids=out["answer"], accepted_lengths=out["accepted"],
                    tree_nodes=out["tree_nodes"], seconds_all=out["seconds_all"]))
                histories[name].append({"role": "assistant", "content": runner.encoder.decode(out["answer"])})
                progress.update(1)
                progress.set_postfix_str(f"{q.task[:14]} {name}", refresh=False)
    return records


def _rounds(runner: Runner, order: list[str], prompts: dict[str, list[int]], repeats: int,
            seed_offset: int) -> dict[str, dict]:
    """Each method's answer in `repeats` rounds of all methods (sharing the machine's slow and fast spells), its
    engine restored before each: the first round's output, the fastest `seconds` and every round's `seconds_all`."""
    starts = {name: runner.engines[name].snapshot() for name in order if name in runner.engines} if repeats > 1 else {}
    runs: dict[str, list[dict]] = {name: [] for name in order}
    for rnd in range(repeats):
        for name in order:
            if rnd and name in starts:
                runner.engines[name].restore(starts[name])
            runs[name].append(runner.answer(name, prompts[name], seed_offset=seed_offset))
    out = {}
    for name, done in runs.items():
        seconds = [run["seconds"] for run in done]
        out[name] = {**done[0], "seconds": min(seconds), "seconds_all": seconds}
    return out


def warm_up(runner: Runner, questions: list[Question], specs: list[MethodSpec], turns: int) -> None:
    """Run every method on the first `turns` first turns that fit with a 32-token answer (else a made-up prompt), then
    reset the matrices: one-off costs (kernel tuning, the cost probe) stay out of the timing."""
    def fitting(texts, n: int) -> list[list[int]]:
        encoded = (runner.encode([{"role": "user", "content": text}]) for text in texts)
        return list(islice((ids for ids in encoded if not runner.overflow(ids, 32)), n))

    prompts = fitting((q.turns[0] for q in questions), turns) or fitting([WARMUP_FALLBACK], 1)
    if not prompts:
        print("bench: no prompt fits the model's context for a warm-up; the first answers include one-off costs",
              file=sys.stderr)
    for ids in prompts:
        for s in specs:
            runner.answer(s.name, ids, max_new_tokens=min(32, runner.args.max_new_tokens))
    runner.reset_matrices()
