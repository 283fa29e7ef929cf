"""`python -m tr_core bench --concurrency N`: every question's first turn, in groups of N, answered N at once
(tr_core/batch.py) and one after another, interleaved per group, the order rotating.

The ways: `<method> alone` and `<method> batched` for the engine methods, `hf batched` (transformers' `generate`,
left-padded). Each engine answer decodes with its own fork of the method's engine in the session's state, so a
batched answer must give the tokens it gives alone (`identical_batched_and_alone`). Throughput is new tokens (cut
after the stop token) over wall seconds, prefill included.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..batch import generate_batch
from ..config import DecodeConfig
from . import answers
from .bench import BASELINE, MethodSpec, Runner, out_of_time
from .questions import Question
from .results import ratio

ENGINE_KINDS = ("vanilla", "recycling")
LEFT_OUT = {"pld": "not batched: transformers' prompt lookup decoding takes one sequence at a time"}
VLLM_NOTE = ("vLLM is not measured here: it batches in its own server (python -m tr_core.vllm.bench --concurrency 1 8, "
             "its own environment, docs/vllm.md)")
BUSY_LOAD = 1.5  # a 1-minute load average above this before the run: other jobs shared the machine


@dataclass(frozen=True)
class Way:
    """A method answering a group of prompts one after another, or the group at once."""

    spec: MethodSpec
    batched: bool

    @property
    def name(self) -> str:
        return f"{self.spec.name} {'batched' if self.batched else 'alone'}"


def left_out(specs: list[MethodSpec]) -> list[str]:
    """Why each method asked for that is not measured here is left out."""
    return [f"{kind}: {why}" for kind, why in LEFT_OUT.items() if kind in {s.kind for s in specs}]


def ways_of(specs: list[MethodSpec]) -> list[Way]:
    """Each engine method alone and batched, `hf` batched; `pld` left out."""
    ways = []
    for s in specs:
        if s.kind in ENGINE_KINDS:
            ways += [Way(s, False), Way(s, True)]
        elif s.kind == "hf":
            ways.append(Way(s, True))
    return ways


def first_turns(runner: Runner, questions: list[Question], max_new: int,
                skipped: list[dict]) -> list[tuple[Question, list[int]]]:
    """Every question's first turn as prompt ids; one too long for the model's context goes to `skipped` instead."""
    prompts = []
    for q in questions:
        ids = runner.encode([{"role": "user", "content": q.turns[0]}])
        if too_long := runner.overflow(ids, max_new):
            print(f"bench: {q.key} skipped: {too_long}", file=sys.stderr)
            skipped.append({"question": q.key, "turn": 1, "reason": too_long})
        else:
            prompts.append((q, ids))
    return prompts


def engine_alone(engine: Any, cfg: DecodeConfig, prompts: list[list[int]], stop_ids: set[int]) -> dict:
    """The prompts one after another, each by its own fork of `engine`: per-prompt ids, wall seconds, steps, nodes."""
    t0 = time.perf_counter()
    outs = [answers.engine_answer(engine.fork(), cfg, ids, stop_ids) for ids in prompts]
    seconds = time.perf_counter() - t0
    return {"emitted": [o["emitted"] for o in outs], "answers": [o["answer"] for o in outs], "seconds": seconds,
            "steps": sum(o["steps"] for o in outs), "tree_nodes": sum(o["tree_nodes"] for o in outs)}


def engine_batched(engine: Any, cfg: DecodeConfig, prompts: list[list[int]], rows: int, stop_ids: set[int]) -> dict:
    """The prompts through tr_core.batch, at most `rows` at once, each by its own fork of `engine`."""
    seconds, steps, summaries = answers.timed_decode(engine.device, generate_batch(engine, prompts, cfg, max_rows=rows))
    cut = [answers.cut_at_stop(summaries[i].tokens, stop_ids, cfg.max_new_tokens) for i in range(len(prompts))]
    return {"emitted": [e for e, _ in cut], "answers": [a for _, a in cut], "seconds": seconds,
            "steps": sum(s.steps for s in summaries.values()), "tree_nodes": sum(len(s.tokens) for s in steps)}


def answer_group(runner: Runner, way: Way, prompts: list[list[int]], rows: int, max_new: int, seed: int) -> dict:
    name = way.spec.name
    if way.spec.kind not in ENGINE_KINDS:
        return answers.transformers_batch(runner.model, prompts, max_new, runner.stop_ids, runner.args, runner.tuned,
                                          seed)
    engine, cfg = runner.engines[name], runner.configs[name].with_(max_new_tokens=max_new)
    if way.batched:
        return engine_batched(engine, cfg, prompts, rows, runner.stop_ids)
    return engine_alone(engine, cfg, prompts, runner.stop_ids)


def warm_up(runner: Runner, group: list[tuple[Question, list[int]]], ways: list[Way]) -> None:
    """Every way once on the first group with 32-token answers, keeping one-off costs out of the timing."""
    prompts = [ids for _, ids in group]
    for way in ways:
        answer_group(runner, way, prompts, runner.args.concurrency, min(32, runner.args.max_new_tokens), 0)


def run_groups(runner: Runner, groups: list[list[tuple[Question, list[int]]]], ways: list[Way],
               args: argparse.Namespace, progress: Any) -> list[dict]:
    """Every group answered by every way, interleaved, `args.repeats` rounds each; one record per group and way:
    the first round's ids, the fastest round's seconds and whether every round gave the same ids."""
    records: list[dict] = []
    start = time.perf_counter()
    for gi, group in enumerate(groups):
        if out_of_time(args, start, gi, len(groups), "groups"):
            break
        order = ways[gi % len(ways):] + ways[:gi % len(ways)]
        prompts = [ids for _, ids in group]
        runs: dict[str, list[dict]] = {way.name: [] for way in ways}
        for _ in range(args.repeats):
            for way in order:
                runs[way.name].append(answer_group(runner, way, prompts, args.concurrency, args.max_new_tokens,
                                                   seed=args.seed + gi))
                progress.update(len(prompts))
                progress.set_postfix_str(way.name, refresh=False)
        for way in ways:
            first, seconds = runs[way.name][0], [run["seconds"] for run in runs[way.name]]
            records.append({"group": gi, "method": way.spec.name, "batched": way.batched,
                            "questions": [q.key for q, _ in group], "tokens": sum(map(len, first["emitted"])),
                            "seconds": min(seconds), "seconds_all": seconds, "steps": first["steps"],
                            "tree_nodes": first["tree_nodes"], "answer_ids": first["answers"],
                            "rounds_agree": all(run["answers"] == first["answers"] for run in runs[way.name])})
    return records


def way_stats(recs: list[dict], refs: list[dict], against: str) -> dict[str, Any]:
    """Totals of one way's records, and how many answers equal those of `refs` (the same groups, way `against`)."""
    tokens, seconds = sum(r["tokens"] for r in recs), sum(r["seconds"] for r in recs)
    steps = None if any(r["steps"] is None for r in recs) else sum(r["steps"] for r in recs)
    pairs = [(a, b) for r, ref in zip(recs, refs) for a, b in zip(r["answer_ids"], ref["answer_ids"])]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": ratio(tokens, seconds), "steps": steps,
            "mean_accepted": ratio(tokens, steps), "answers": sum(len(r["answer_ids"]) for r in recs),
            "mean_tree_nodes": ratio(sum(r["tree_nodes"] for r in recs), steps) if steps else None,
            "identical": sum(a == b for a, b in pairs), "compared": len(pairs), "identical_to": against}


def summarize(records: list[dict], ways: list[Way]) -> dict[str, dict]:
    """Per method: `alone` and `batched` way_stats (batched against the method's alone answers; alone and `hf`
    against plain decoding's alone answers), and the throughput ratios of its batched way."""
    def of(name: str, batched: bool) -> list[dict]:
        return [r for r in records if r["method"] == name and r["batched"] == batched]

    methods: dict[str, dict] = {}
    for way in ways:
        name = way.spec.name
        entry = methods.setdefault(name, {"kind": way.spec.kind, "template": way.spec.template})
        reference = name if way.batched and way.spec.kind in ENGINE_KINDS else BASELINE
        entry["batched" if way.batched else "alone"] = way_stats(of(name, way.batched), of(reference, False),
                                                                 f"{reference} alone")
    plain = methods.get(BASELINE, {}).get("batched", {}).get("tokens_per_s")
    hf = methods.get("hf", {}).get("batched", {}).get("tokens_per_s")
    for m in methods.values():
        fast = m["batched"]["tokens_per_s"]
        m.update(batched_over_alone=ratio(fast, m.get("alone", {}).get("tokens_per_s")),
                 batched_over_plain_batched=ratio(fast, plain), batched_over_hf_batched=ratio(fast, hf))
    return methods


def build_result(records: list[dict], ways: list[Way], questions: list[Question], meta: dict[str, Any],
                 skipped: list[dict], rows: int, load: dict[str, list[float]], notes: list[str]) -> dict[str, Any]:
    """The JSON document of a concurrency run: metadata, the `methods` (summarize), whether every engine answer was
    the same batched and alone, notes, and one row per group and way."""
    done = {key for r in records for key in r["questions"]}
    methods = summarize(records, ways)
    engine = [m for m in methods.values() if m["kind"] in ENGINE_KINDS]
    notes = [*notes, VLLM_NOTE]
    if load["before"] and load["before"][0] > BUSY_LOAD:
        notes.append(f"a busy machine: load average {load['before'][0]:.2f} before the run (other jobs); every way "
                     "shared it, but the figures may be low and the ratios noisier")
    rows_out = [{k: v for k, v in r.items() if k != "answer_ids"} for r in records]
    return {**meta, "concurrency": rows, "questions_selected": len(questions),
            "questions": len(done), "answers": len(done), "groups": len({r["group"] for r in records}),
            "skipped": list(skipped), "question_keys": [q.key for q in questions if q.key in done],
            "identical_batched_and_alone": bool(engine) and all(r.get("rounds_agree", True) for r in records) and all(
                m["batched"]["identical"] == m["batched"]["compared"] for m in engine),
            "load_average": load, "notes": notes, "methods": methods, "records": rows_out}


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages (empty where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
