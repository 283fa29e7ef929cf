"""`python -m tr_core bench`: Token Recycling against plain decoding and its peers, Spec-Bench style.

Every method runs on the same model, prompts and settings, interleaved per question (after a warm-up)
so that machine drift hits all alike. Methods and their names in tables and JSON:

- `vanilla`: the engine's plain decoding (`DecodeConfig(plain=True)`); the baseline of every speedup.
- `recycling`: Token Recycling with the `--template` tree. Given several templates
  (`--template 2.2.2,adaptive`), `recycling` expands to one method per template, named
  `recycling[2.2.2]`, `recycling[adaptive]`; such names may also be listed in `--methods` directly.
  Each recycling method has its own adjacency matrix, kept across questions unless `--fresh-matrix`, starting
  from the model's warm start (`--warm-start auto`, the default; tr_core/warm.py) or empty (`--warm-start off`).
  `--fresh-sessions` measures what a new visitor sees: every question's first turn only, each method back to a new
  session's state before it (the warm start or an empty matrix, the drafters' starting calibration and trust; the
  forward-cost curve measured on this machine is kept).
- `hf`: transformers' `model.generate` (greedy, or the same sampling settings).
- `pld`: transformers' prompt lookup decoding (`generate(prompt_lookup_num_tokens=...)`).

Definitions (as Spec-Bench): time is wall time per answer, prefill included (with `--repeats R`, the fastest
of R rounds of all methods, each round from the same learned state); speedup is vanilla's total
seconds over the method's on the same answers; mean accepted tokens is emitted tokens per decoding
forward (the engine's steps; for hf/pld every forward of the model, the first of which also reads the
prompt, so plain decoding scores 1.00 either way). Answers are cut after the first stop token (or at
`--max-new-tokens`); two answers are identical when their token ids before the stop token are equal.
Multi-turn questions are answered turn by turn with the method's own earlier answers in the history;
`identical`/`compared` count answers, i.e. turns.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import DecodeConfig
from ..tree import check_template
from .questions import Question, load_questions, select_questions, task_sort_key

METHOD_KINDS = ("vanilla", "recycling", "hf", "pld")
BASELINE = "vanilla"


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


# ----------------------------------------------------------------------------- input validation


def parse_methods(methods: str, templates: str) -> list[MethodSpec]:
    """Turn `--methods` and `--template` into MethodSpecs (vanilla first, added if missing); raises BenchInputError."""
    tpl_list = [t.strip() for t in templates.split(",") if t.strip()]
    if not tpl_list:
        raise BenchInputError("--template: give at least one template name")
    for t in tpl_list:
        _check_template(t, "--template")
    specs: list[MethodSpec] = []
    for raw in [m.strip() for m in methods.split(",") if m.strip()]:
        if raw == "recycling":
            if len(tpl_list) == 1:
                specs.append(MethodSpec("recycling", "recycling", tpl_list[0]))
            else:
                specs.extend(MethodSpec(f"recycling[{t}]", "recycling", t) for t in tpl_list)
        elif raw.startswith("recycling[") and raw.endswith("]"):
            t = _check_template(raw[len("recycling[") : -1], "--methods", f" in {raw!r}")
            specs.append(MethodSpec(raw, "recycling", t))
        elif raw in METHOD_KINDS:
            specs.append(MethodSpec(raw, raw))
        else:
            raise BenchInputError(
                f"--methods: unknown method {raw!r}; choose from {', '.join(METHOD_KINDS)} or recycling[TEMPLATE]"
            )
    if not specs:
        raise BenchInputError("--methods: give at least one method")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BenchInputError(f"--methods: method listed twice: {', '.join(dupes)}")
    if BASELINE not in names:
        specs.insert(0, MethodSpec(BASELINE, BASELINE))
    else:
        specs.sort(key=lambda s: s.name != BASELINE)  # baseline first, others in the given order
    return specs


def _check_template(name: str, option: str, where: str = "") -> str:
    """check_template, its error a BenchInputError naming `option`."""
    try:
        return check_template(name, where)
    except ValueError as exc:
        raise BenchInputError(f"{option}: {exc}") from None


def load_all_questions(paths: list[str], per_task: int | None, limit: int | None) -> list[Question]:
    """Load every question file and select deterministically; raises QuestionFileError / BenchInputError."""
    questions: list[Question] = []
    for p in paths:
        questions.extend(load_questions(p))
    first: dict[str, Question] = {}
    for q in questions:
        if (other := first.setdefault(q.key, q)) is not q:
            raise BenchInputError(
                f"two questions are both named {q.key!r} ({other.source}:{other.line} and {q.source}:{q.line}): "
                "the same file given twice, two files of the same name, or ids that differ only as number and text")
    if per_task is not None and per_task < 1:
        raise BenchInputError(f"--per-task must be >= 1, got {per_task}")
    if limit is not None and limit < 1:
        raise BenchInputError(f"--limit must be >= 1, got {limit}")
    return select_questions(questions, per_task=per_task, limit=limit)


# ----------------------------------------------------------------------------- answers


def cut_at_stop(ids: list[int], stop_ids: set[int], max_new_tokens: int) -> tuple[list[int], list[int]]:
    """Return (emitted, answer): ids cut at max_new_tokens and after the first stop token; answer drops the stop."""
    ids = list(ids[:max_new_tokens])
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[: i + 1], ids[:i]
    return ids, ids


def _sync(device: Any) -> None:
    """Wait for queued GPU work so wall times are exact (no-op on CPU)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


class Runner:
    """Runs each method on one prompt; owns one Engine per engine method (each with its own matrix)."""

    def __init__(self, model, tokenizer, specs: list[MethodSpec], args: argparse.Namespace, base: DecodeConfig) -> None:
        from ..engine import Engine

        self.model = model
        self.tokenizer = tokenizer
        self.args = args
        self.device = next(model.parameters()).device
        tune = getattr(args, "linear", "auto") == "auto"
        self.engines = {s.name: Engine(model, tokenizer, topk_candidates=args.topk_candidates, tune_kernels=tune)
                        for s in specs if s.kind in ("vanilla", "recycling")}
        any_engine = next(iter(self.engines.values()))
        self.encoder = any_engine  # one chat template for every method
        self.stop_ids = set(int(t) for t in any_engine.stop_token_ids)
        self.configs = {s.name: base.with_(plain=True) if s.kind == "vanilla" else base.with_(template=s.template)
                        for s in specs if s.kind in ("vanilla", "recycling")}
        self.specs = {s.name: s for s in specs}
        self.warm: Any = None  # the WarmStartInfo applied to the recycling engines (None: they start cold)
        self.session_starts: dict[str, dict] = {}  # per engine, a new session's state (`start_sessions`)

    def reset_matrices(self) -> None:
        """Forget everything the adjacency matrices and context indexes learnt: back to the warm start's matrix when
        there is one (`start_sessions`), else empty."""
        for name, engine in self.engines.items():
            engine.forget()
            if name in self.session_starts:
                engine.matrix.copy_from(self.session_starts[name]["matrix"])

    def start_sessions(self, warm_start: Callable[[Any], Any]) -> None:
        """Put every engine in a new session's state (warm.fresh_session), the recycling ones warmed by `warm_start`
        (engine -> its WarmStartInfo, or None when it starts cold: `--warm-start`, applied by the command line), and
        keep that state for `fresh_session` and `reset_matrices`."""
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
        """Why a prompt of `ids` with up to `max_new_tokens` answer tokens does not fit the model's context ('' when
        it fits): every method must be able to give the whole answer."""
        limit = self.encoder.context_limit
        if len(ids) + max_new_tokens <= limit:
            return ""
        return (f"its prompt has {len(ids)} tokens and --max-new-tokens is {max_new_tokens}, "
                f"more than the model's context of {limit} tokens")

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat prompt as token ids, the same for every method."""
        return list(self.encoder.encode_chat(messages))

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text (for the next turn's history)."""
        return self.encoder.decode(ids)

    def answer(self, name: str, ids: list[int], max_new_tokens: int | None = None, seed_offset: int = 0) -> dict:
        """Answer one prompt with method `name`; returns emitted/answer ids, seconds, steps and accepted lengths."""
        spec = self.specs[name]
        max_new = max_new_tokens or self.args.max_new_tokens
        if spec.kind in ("vanilla", "recycling"):
            return self._engine_answer(name, ids, max_new)
        return self._hf_answer(spec.kind, ids, max_new, seed_offset)

    def snapshot(self, name: str) -> dict | None:
        """What method `name` has learned so far (an engine's `snapshot`; None for the stateless hf and pld)."""
        engine = self.engines.get(name)
        return engine.snapshot() if engine is not None else None

    def restore(self, name: str, snapshot: dict | None) -> None:
        """Return method `name` to a `snapshot` of it."""
        if snapshot is not None:
            self.engines[name].restore(snapshot)

    def _engine_answer(self, name: str, ids: list[int], max_new: int) -> dict:
        from ..events import StepEvent, SummaryEvent

        engine, cfg = self.engines[name], self.configs[name].with_(max_new_tokens=max_new)
        accepted: list[int] = []
        nodes = 0
        summary = None
        _sync(self.device)
        t0 = time.perf_counter()
        for ev in engine.generate(ids, cfg):
            if isinstance(ev, StepEvent):
                accepted.append(len(ev.emitted))
                nodes += len(ev.tokens)
            elif isinstance(ev, SummaryEvent):
                summary = ev
        _sync(self.device)
        seconds = time.perf_counter() - t0
        assert summary is not None, "the engine must end with a SummaryEvent"
        emitted, answer = cut_at_stop(summary.tokens, self.stop_ids, max_new)
        return {"emitted": emitted, "answer": answer, "seconds": seconds, "steps": summary.steps,
                "accepted": accepted, "tree_nodes": nodes}

    def _products(self):
        """The engines' timed matrix products installed on the model for a transformers baseline's call."""
        import contextlib

        from ..kernels import installed

        tuned = any(e.tune_kernels for e in self.engines.values())
        return installed(self.model) if tuned else contextlib.nullcontext()

    def _hf_answer(self, kind: str, ids: list[int], max_new: int, seed_offset: int) -> dict:
        import torch
        from transformers import GenerationConfig

        sample = self.args.temperature > 0
        stop = sorted(self.stop_ids)
        gen = dict(max_new_tokens=max_new, do_sample=sample, eos_token_id=stop, pad_token_id=stop[0],
                   repetition_penalty=self.args.repetition_penalty)
        if sample:
            gen.update(temperature=self.args.temperature, top_p=self.args.top_p, top_k=self.args.top_k)
        if kind == "pld":
            gen.update(prompt_lookup_num_tokens=self.args.pld_tokens, max_matching_ngram_size=self.args.pld_ngram)
        config = GenerationConfig(**gen)
        inputs = torch.tensor([ids], dtype=torch.long, device=self.device)
        forwards = [0]
        # Count forwards with a hook (the public nn.Module API), not by replacing model methods.
        handle = self.model.register_forward_pre_hook(lambda module, inp: forwards.__setitem__(0, forwards[0] + 1))
        try:
            if sample:
                torch.manual_seed(self.args.seed + seed_offset)
            # the baselines multiply with the same timed products as the engine (kernels.py), installed for this
            # call only, so that a speedup measures the method and not the matrix products
            with torch.inference_mode(), self._products():
                _sync(self.device)
                t0 = time.perf_counter()
                out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config)
                _sync(self.device)
                seconds = time.perf_counter() - t0
        finally:
            handle.remove()
        new = out[0, inputs.shape[1]:].tolist()
        emitted, answer = cut_at_stop(new, self.stop_ids, max_new)
        return {"emitted": emitted, "answer": answer, "seconds": seconds, "steps": forwards[0] or None,
                "accepted": [], "tree_nodes": 0}


def run_questions(runner: Runner, questions: list[Question], specs: list[MethodSpec], args: argparse.Namespace,
                  progress=None, skipped: list[dict] | None = None) -> list[TurnRecord]:
    """Answer every question with every method, interleaved per turn; returns one record per turn and method.

    The method order rotates from question to question so no method always runs first (after another's cache
    traffic). Each method keeps its own conversation history for multi-turn questions. With `--repeats R` every
    turn is answered in R rounds of all methods, each method restarting from what it had learned before the turn
    (`Runner.snapshot`), so that the rounds of all methods share the machine's slow and fast spells; a record keeps
    the first round's answer, the fastest round's time and every round's. A turn that does not fit the model's
    context is skipped with its later turns, each appended to `skipped` as {question, turn, reason}.
    """
    records: list[TurnRecord] = []
    names = [s.name for s in specs]
    budget = getattr(args, "max_minutes", None)
    start = time.perf_counter()
    for qi, q in enumerate(questions):
        if budget is not None and time.perf_counter() - start > budget * 60:
            print(f"bench: --max-minutes {budget} reached; stopping after {qi} of {len(questions)} questions",
                  file=sys.stderr)
            break
        if getattr(args, "fresh_sessions", False):
            runner.fresh_session()
        elif args.fresh_matrix:
            runner.reset_matrices()
        r = qi % len(names)
        order = names[r:] + names[:r]
        histories: dict[str, list[dict[str, str]]] = {name: [] for name in order}
        turns = q.turns[:1] if getattr(args, "fresh_sessions", False) else q.turns  # a new session's first answer
        for ti, turn in enumerate(turns):
            prompts = {}
            for name in order:
                histories[name].append({"role": "user", "content": turn})
                prompts[name] = runner.encode(histories[name])
            if too_long := max(runner.overflow(ids, args.max_new_tokens) for ids in prompts.values()):
                print(f"bench: {q.key} turn {ti + 1} skipped (and any later turns): {too_long}", file=sys.stderr)
                if skipped is not None:
                    skipped += [{"question": q.key, "turn": t + 1, "reason": too_long} for t in range(ti, len(q.turns))]
                break  # later turns build on this one
            outs = _rounds(runner, order, prompts, getattr(args, "repeats", 1), seed_offset=qi * 16 + ti)
            for name in order:
                records.append(_record(name, q, ti, prompts[name], outs[name]))
                histories[name].append({"role": "assistant", "content": runner.decode(outs[name]["answer"])})
                if progress is not None:
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
    """Each method's answer to its prompt in `repeats` rounds of all methods (each restored to its state before the
    first round): the first round's output with the fastest round's `seconds` and every round's `seconds_all`."""
    starts = {name: runner.snapshot(name) for name in order} if repeats > 1 else {}
    runs: dict[str, list[dict]] = {name: [] for name in order}
    for rnd in range(repeats):
        for name in order:
            if rnd:
                runner.restore(name, starts[name])
            runs[name].append(runner.answer(name, prompts[name], seed_offset=seed_offset))
    out = {}
    for name, done in runs.items():
        seconds = [run["seconds"] for run in done]
        out[name] = {**done[0], "seconds": min(seconds), "seconds_all": seconds}
    return out


WARMUP_FALLBACK = "Say hello in one short sentence."


def warmup_prompts(runner: Runner, questions: list[Question], turns: int) -> list[list[int]]:
    """The first `turns` first turns that fit the model's context with a 32-token answer; a short made-up prompt when
    none does. Skipping an over-long first question must not leave the one-off costs (kernel tuning, the cost probe)
    inside the first timed answer."""
    prompts = []
    for q in questions:
        if len(prompts) == turns:
            break
        ids = runner.encode([{"role": "user", "content": q.turns[0]}])
        if not runner.overflow(ids, 32):
            prompts.append(ids)
    if not prompts:
        ids = runner.encode([{"role": "user", "content": WARMUP_FALLBACK}])
        if not runner.overflow(ids, 32):
            prompts.append(ids)
    return prompts


def warm_up(runner: Runner, questions: list[Question], specs: list[MethodSpec], turns: int) -> None:
    """Run every method on `turns` short prompts (warmup_prompts), then reset the matrices."""
    prompts = warmup_prompts(runner, questions, turns)
    if not prompts:
        print("bench: no prompt fits the model's context for a warm-up; the first answers include one-off costs",
              file=sys.stderr)
    for ids in prompts:
        for s in specs:
            runner.answer(s.name, ids, max_new_tokens=min(32, runner.args.max_new_tokens))
    runner.reset_matrices()


# ----------------------------------------------------------------------------- aggregation


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _plausible(speedup: float | None, mean_accepted: float | None) -> bool | None:
    """False when a speedup exceeds what its mean accepted tokens per step allow (speed.plausible_limit): the
    machine's load changed during the run, and the figure is noise. None when either number is missing."""
    from .meter import plausible_limit

    if speedup is None or mean_accepted is None:
        return None
    return speedup <= plausible_limit(mean_accepted)


def _speedup_cell(stats: dict[str, Any]) -> str:
    """A table cell: the speedup, flagged when implausible."""
    return _fmt(stats["speedup"], ".2f", "x") + (" ⚠ noisy" if stats.get("plausible") is False else "")


def _stats(recs: list[TurnRecord], base: dict[tuple[str, int], TurnRecord]) -> dict[str, Any]:
    """Totals of a set of records, with speedup and identical counts against the baseline records `base`."""
    tokens = sum(r.tokens for r in recs)
    seconds = sum(r.seconds for r in recs)
    steps = None if any(r.steps is None for r in recs) else sum(r.steps for r in recs)
    paired = [(r, base[(r.question, r.turn)]) for r in recs if (r.question, r.turn) in base]
    base_seconds = sum(b.seconds for _, b in paired)
    own_seconds = sum(r.seconds for r, _ in paired)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": _ratio(tokens, seconds),
        "steps": steps,
        "mean_accepted": _ratio(tokens, steps) if steps else None,
        "mean_tree_nodes": (_ratio(sum(r.tree_nodes for r in recs), steps)
                            if steps and all(r.tree_nodes for r in recs) else None),
        "speedup": _ratio(base_seconds, own_seconds) if paired else None,
        "plausible": _plausible(_ratio(base_seconds, own_seconds) if paired else None,
                                _ratio(tokens, steps) if steps else None),
        "identical": sum(r.answer_ids == b.answer_ids for r, b in paired),
        "compared": len(paired),
        "answers": len(recs),
    }


def accepted_histogram(recs: list[TurnRecord]) -> dict[str, int]:
    """Count of decoding steps by tokens emitted per step (engine methods; empty for hf/pld)."""
    hist: dict[int, int] = {}
    for r in recs:
        for n in r.accepted_lengths:
            hist[n] = hist.get(n, 0) + 1
    return {str(k): hist[k] for k in sorted(hist)}


def aggregate(records: list[TurnRecord], method_names: list[str], baseline: str = BASELINE) -> dict[str, dict]:
    """Per-method totals and per-task breakdown (the `methods` part of the JSON contract)."""
    base = {(r.question, r.turn): r for r in records if r.method == baseline}
    out: dict[str, dict] = {}
    for name in method_names:
        mine = [r for r in records if r.method == name]
        entry = _stats(mine, base)
        tasks = sorted({r.task for r in mine}, key=task_sort_key)
        entry["per_category"] = {t: _stats([r for r in mine if r.task == t], base) for t in tasks}
        entry["accepted_histogram"] = accepted_histogram(mine)
        out[name] = entry
    return out


def build_result(records: list[TurnRecord], specs: list[MethodSpec], questions: list[Question],
                 meta: dict[str, Any], skipped: list[dict] = ()) -> dict[str, Any]:
    """The full JSON document: run metadata, the `methods` aggregate, one row per answer and the `skipped` turns.

    Only questions with records count (a `--max-minutes` run may stop before the last ones), and only the turns
    answered: a turn past the model's context is in `skipped`, not in `answers`.
    """
    done = {r.question for r in records}
    selected = len(questions)
    questions = [q for q in questions if q.key in done]
    meta = {**meta, "questions_selected": selected}
    methods = aggregate(records, [s.name for s in specs])
    for s in specs:
        methods[s.name]["kind"] = s.kind
        methods[s.name]["template"] = s.template
    rows = [{k: v for k, v in asdict(r).items() if k not in ("answer_ids", "accepted_lengths")} for r in records]
    answered = len({(r.question, r.turn) for r in records})
    return {**meta, "questions": len(questions), "answers": answered, "skipped": list(skipped),
            "question_keys": [q.key for q in questions], "methods": methods, "records": rows}


# ----------------------------------------------------------------------------- reports


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def format_tables(result: dict[str, Any]) -> str:
    """Markdown tables: overall per method, then speedup (mean accepted) per task and method."""
    methods = result["methods"]
    lines = ["| method | mean accepted | tokens/s | speedup | identical to vanilla |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, m in methods.items():
        lines.append(f"| {name} | {_fmt(m['mean_accepted'], '.2f')} | {_fmt(m['tokens_per_s'], '.1f')} | "
                     f"{_speedup_cell(m)} | {m['identical']}/{m['compared']} |")
    tasks = sorted({t for m in methods.values() for t in m["per_category"]}, key=task_sort_key)
    lines += ["", "Speedup over vanilla (mean accepted tokens per step) by task:", "",
              "| method | " + " | ".join(tasks) + " | overall |",
              "| --- | " + " | ".join("---:" for _ in tasks) + " | ---: |"]
    for name, m in methods.items():
        cells = []
        for t in [*tasks, None]:
            c = m if t is None else m["per_category"].get(t)
            cells.append("" if c is None else f"{_speedup_cell(c)} ({_fmt(c['mean_accepted'], '.2f')})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any(c.get("plausible") is False for m in methods.values() for c in [m, *m["per_category"].values()]):
        lines += ["", "⚠ noisy: a speedup above what the mean accepted tokens per step allow (more than "
                      "1.1 x mean accepted): the machine's load changed during the run; rerun on a quiet machine."]
    return "\n".join(lines)


def format_header(result: dict[str, Any]) -> str:
    """One paragraph saying what was run where."""
    return (f"model {result['model']} · {result['device']} ({result.get('machine', '')}) · {result['dtype']} · "
            f"torch {result['torch']} · transformers {result['transformers']} · {result['date']}\n"
            f"{result['questions']} questions ({result['answers']} answers"
            f"{', %d turns skipped: too long for the model' % len(result['skipped']) if result.get('skipped') else ''})"
            f" · max_new_tokens {result['max_new_tokens']}"
            f" · temperature {result['temperature']} · template {result['template']}"
            f" · matrix {'fresh per question' if result.get('fresh_matrix') else 'kept across questions'}"
            f" · torch threads {result.get('threads', '?')}"
            f"{' · fastest of %d repeats per answer' % result['repeats'] if result.get('repeats', 1) > 1 else ''}\n"
            f"command: {result.get('command', '')}")


def write_html(result: dict[str, Any], path: str | Path) -> None:
    """A self-contained plotly report: speedup and mean accepted per task and method, accepted-length histogram."""
    import html

    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    methods = result["methods"]
    tasks = sorted({t for m in methods.values() for t in m["per_category"]}, key=task_sort_key)
    xs = [*tasks, "overall"]
    fig = make_subplots(rows=3, cols=1, vertical_spacing=0.09, subplot_titles=(
        "Speedup over vanilla (total time on the same answers)", "Mean accepted tokens per decoding forward",
        "Tokens emitted per step (engine methods), share of steps"))
    for name, m in methods.items():
        cells = [m["per_category"].get(t) or {} for t in tasks] + [m]
        fig.add_trace(go.Bar(name=name, x=xs, y=[c.get("speedup") for c in cells], legendgroup=name,
                             hovertemplate="%{x}: %{y:.2f}x<extra>" + name + "</extra>"), row=1, col=1)
        fig.add_trace(go.Bar(name=name, x=xs, y=[c.get("mean_accepted") for c in cells], legendgroup=name,
                             showlegend=False, hovertemplate="%{x}: %{y:.2f}<extra>" + name + "</extra>"), row=2, col=1)
        hist = m.get("accepted_histogram") or {}
        total = sum(hist.values())
        if total:
            fig.add_trace(go.Bar(name=name, x=[int(k) for k in hist], y=[v / total for v in hist.values()],
                                 legendgroup=name, showlegend=False,
                                 hovertemplate="%{x} tokens: %{y:.1%}<extra>" + name + "</extra>"), row=3, col=1)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=1)
    fig.update_layout(barmode="group", height=1100, title="Token Recycling Studio benchmark",
                      template="plotly_white")
    fig.update_xaxes(title_text="tokens emitted in one step", dtick=1, row=3, col=1)
    plot = pio.to_html(fig, include_plotlyjs=True, full_html=False)
    table = _markdown_to_html(format_tables(result))
    doc = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Token Recycling benchmark</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}</style>"
        f"</head><body><h1>Token Recycling benchmark</h1><pre>{html.escape(format_header(result))}</pre>"
        f"{table}{plot}</body></html>"
    )
    Path(path).write_text(doc, encoding="utf-8")


def _markdown_to_html(text: str) -> str:
    """Render the simple markdown tables of `format_tables` (and the lines between them) as HTML."""
    import html

    out: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            head, body = rows[0], rows[2:]
            out.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            rows.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        else:
            flush()
            if line.strip():
                out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "".join(out)


def _git_commit() -> str:
    """Short commit of the code that ran (with '+changes' when the tree differs), or '' outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "tr_core"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+changes" if head and dirty else "")


def run_meta(args: argparse.Namespace, model, device) -> dict[str, Any]:
    """Metadata of the run (the top-level keys of the JSON contract, but `questions` and `methods`)."""
    import torch
    import transformers

    from ..machine import describe
    from ..runner import GQA_SWITCH

    dev = str(device)
    name = Path(args.model).name if args.model else "SmolLM2-135M-Instruct (embedded, Q4_1 GGUF dequantised)"
    return {
        "model": name,
        "device": dev,
        "machine": describe(device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
        "template": args.template,
        "fresh_matrix": bool(args.fresh_matrix),
        "fresh_sessions": bool(getattr(args, "fresh_sessions", False)),
        "topk_candidates": args.topk_candidates,
        "pld_tokens": args.pld_tokens,
        "pld_ngram": args.pld_ngram,
        "repeats": getattr(args, "repeats", 1),
        "threads": torch.get_num_threads(),
        "sdpa_shared_kv_heads": os.environ.get(GQA_SWITCH) == "1",  # masked attention reads grouped heads (runner.py)
        "commit": _git_commit(),
        "command": ("python -m tr_core " + shlex.join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("__main__.py")
                    else shlex.join(sys.argv)),
    }
