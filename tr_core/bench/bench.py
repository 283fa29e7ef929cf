"""`python -m tr_core bench`: Token Recycling against plain decoding and its peers, Spec-Bench style.

Every method runs on the same model, prompts and settings, interleaved per question (after a warm-up) so that
machine drift hits all alike. Methods and their names in tables and JSON:

- `vanilla`: the engine's plain decoding (`DecodeConfig(plain=True)`); the baseline of every speedup.
- `recycling`: Token Recycling with the `--template` tree. Several templates (`--template 2.2.2,adaptive`) give
  one method each, `recycling[2.2.2]`, `recycling[adaptive]`, names `--methods` also takes. Each has its own
  adjacency matrix, kept across questions unless `--fresh-matrix`, starting from the model's warm start
  (`--warm-start auto`, the default) or empty (`off`). `--fresh-sessions` measures what a new visitor sees: every
  question's first turn only, each method from a new session's state (the measured forward costs are kept).
- `hf`: transformers' `model.generate` (greedy, or the same sampling settings).
- `pld`: transformers' prompt lookup decoding (`generate(prompt_lookup_num_tokens=...)`).

`--concurrency N` measures throughput instead: every first turn N at once (tr_core.batch) against one after
another, each answer from the session's state (tr_core/bench/concurrency.py says how).

Definitions (as Spec-Bench): time is wall time per answer, prefill included (with `--repeats R`, the fastest
of R rounds of all methods, each round from the same learned state); speedup is vanilla's total seconds over the
method's on the same answers; mean accepted tokens is emitted tokens per decoding forward (for hf/pld every
forward of the model, prompt included, so plain decoding scores 1.00 either way). Answers are cut after the first
stop token (or at `--max-new-tokens`); two are identical when their token ids before the stop token are equal.
Multi-turn questions are answered turn by turn with the method's own earlier answers in the history;
`identical`/`compared` count answers, i.e. turns.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..config import DecodeConfig
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
    """One benchmarked method: its display name, its kind and, for recycling, its draft tree template."""

    name: str  # e.g. "vanilla", "recycling", "recycling[adaptive]", "hf", "pld"
    kind: str  # one of METHOD_KINDS
    template: str = ""  # recycling only: a name from tree.TEMPLATE_NAMES


@dataclass
class TurnRecord:
    """What one method produced for one turn of one question, and what it cost."""

    method: str  # MethodSpec.name
    question: str  # Question.key
    category: str  # the question's category
    task: str  # its Spec-Bench task
    turn: int  # 0-based turn index
    prompt_tokens: int  # prompt length in tokens
    tokens: int  # emitted tokens (stop token included, cut at max_new_tokens)
    seconds: float  # wall time of the answer, prefill included (the fastest of its repeats)
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
    """check_template, its error a BenchInputError naming `option`."""
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
        from ..engine import Engine

        self.model, self.args, self.device = model, args, next(model.parameters()).device
        self.specs = {s.name: s for s in specs}
        engine_specs = [s for s in specs if s.kind in ("vanilla", "recycling")]
        self.engines = {s.name: Engine(model, tokenizer, topk_candidates=args.topk_candidates,
                                       tune_kernels=args.linear == "auto") for s in engine_specs}
        self.configs = {s.name: base.with_(plain=True) if s.kind == "vanilla" else base.with_(template=s.template)
                        for s in engine_specs}
        self.encoder = next(iter(self.engines.values()))  # one chat template and stop set for every method
        self.stop_ids = {int(t) for t in self.encoder.stop_token_ids}
        self.warm: Any = None  # the WarmStartInfo applied to the recycling engines (None: they start cold)
        self.session_starts: dict[str, dict] = {}  # per engine, a new session's state (`start_sessions`)

    def reset_matrices(self) -> None:
        """Forget what the matrices and context indexes learnt: back to the session's start, else empty."""
        for name, engine in self.engines.items():
            engine.forget(to=self.session_starts.get(name))

    def start_sessions(self, warm_start: Callable[[Any], Any]) -> None:
        """Put every engine in a new session's state, the recycling ones warmed by `warm_start` (engine -> its
        WarmStartInfo or None), and keep that state for `fresh_session` and `reset_matrices`."""
        from .. import warm

        for name, engine in self.engines.items():
            warm.fresh_session(engine)
            if self.specs[name].kind == "recycling" and (info := warm_start(engine)) is not None:
                self.warm = info
            self.session_starts[name] = engine.snapshot()

    def fresh_session(self) -> None:
        """Every engine back to its new session's state."""
        for name, start in self.session_starts.items():
            self.engines[name].restore(start)

    def overflow(self, ids: list[int], max_new_tokens: int) -> str:
        """Why a prompt of `ids` and `max_new_tokens` answer tokens overflows the model's context ('' if it fits)."""
        limit = self.encoder.context_limit
        return "" if len(ids) + max_new_tokens <= limit else (
            f"its prompt has {len(ids)} tokens and --max-new-tokens is {max_new_tokens}, more than the model's context "
            f"of {limit} tokens")

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat prompt as token ids, the same for every method."""
        return list(self.encoder.encode_chat(messages))

    def answer(self, name: str, ids: list[int], max_new_tokens: int | None = None, seed_offset: int = 0) -> dict:
        """Method `name`'s answer to one prompt (answers.py's dict)."""
        max_new = max_new_tokens or self.args.max_new_tokens
        if name in self.engines:
            return answers.engine_answer(self.engines[name], self.configs[name].with_(max_new_tokens=max_new), ids,
                                         self.stop_ids)
        tuned = any(e.tune_kernels for e in self.engines.values())  # the baselines multiply as the engines do
        return answers.transformers_answer(self.model, self.specs[name].kind, ids, max_new, self.stop_ids, self.args,
                                           tuned, seed=self.args.seed + seed_offset)


def run_questions(runner: Runner, questions: list[Question], specs: list[MethodSpec], args: argparse.Namespace,
                  progress: Any, skipped: list[dict]) -> list[TurnRecord]:
    """Answer every question with every method, interleaved per turn; one record per turn and method.

    The method order rotates from question to question, so no method always runs first. Each method keeps its own
    history of a multi-turn question. A turn that does not fit the model's context is skipped with its later turns,
    each appended to `skipped` as {question, turn, reason}. `progress` (a tqdm bar) counts the answers.
    """
    records: list[TurnRecord] = []
    names = [s.name for s in specs]
    start = time.perf_counter()
    for qi, q in enumerate(questions):
        if args.max_minutes is not None and time.perf_counter() - start > args.max_minutes * 60:
            print(f"bench: --max-minutes {args.max_minutes} reached; stopping after {qi} of {len(questions)} "
                  "questions", file=sys.stderr)
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
                records.append(_record(name, q, ti, prompts[name], outs[name]))
                histories[name].append({"role": "assistant", "content": runner.encoder.decode(outs[name]["answer"])})
                progress.update(1)
                progress.set_postfix_str(f"{q.task[:14]} {name}", refresh=False)
    return records


def _record(name: str, q: Question, turn: int, ids: list[int], out: dict) -> TurnRecord:
    """One method's answer to one turn, as the benchmark records it."""
    return TurnRecord(method=name, question=q.key, category=q.category, task=q.task, turn=turn,
                      prompt_tokens=len(ids), tokens=len(out["emitted"]), seconds=out["seconds"], steps=out["steps"],
                      answer_ids=out["answer"], accepted_lengths=out["accepted"], tree_nodes=out["tree_nodes"],
                      seconds_all=out["seconds_all"])


def _rounds(runner: Runner, order: list[str], prompts: dict[str, list[int]], repeats: int,
            seed_offset: int) -> dict[str, dict]:
    """Each method's answer in `repeats` rounds of all methods, its engine restored to its state before the first:
    the first round's output with the fastest round's `seconds` and every round's `seconds_all`. Rounds of all
    methods share the machine's slow and fast spells."""
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
    """Run every method on the first `turns` first turns that fit the model's context with a 32-token answer (else a
    made-up prompt), then reset the matrices: one-off costs (kernel tuning, the cost probe) stay out of the timing."""
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
