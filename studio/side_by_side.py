"""The paper's method beside the hybrid: one question answered by plain decoding, by the paper's matrix-only tree and
by the hybrid tree, each from the same starting matrix, taking turns so that a change of load hits all alike; shown
side by side with tokens per step, measured speed, where the accepted drafts came from, and whether each answer is
plain decoding's token for token."""
from __future__ import annotations

import contextlib
import html
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from present.chart import draft_credit
from present.glossary import gloss
from present.meter import identity_words, ratio_class
from present.sides import best_step, pays_svg, silhouette_svg
from tr_core.config import DecodeConfig
from tr_core.events import StepEvent, SummaryEvent

from . import zerogpu

PAPER, HYBRID = "2.2.2", "hybrid"  # the paper's static tree (the matrix alone, 80 nodes), and the studio's default
METHODS = (("plain", "Plain decoding"), (PAPER, "The paper's method: the matrix alone, its 80-node tree"),
           (HYBRID, "The hybrid: matrix + context, its tree sized for this machine"))
ROUNDS = 2  # each method decodes the question this many times, in turns; its fastest run is shown
TOKENS = 64  # new tokens per answer (greedy)


@dataclass
class MethodRun:
    """One method's answer to the question: its tokens, steps and fastest decode time over the rounds."""

    template: str
    name: str
    tokens: list[int]
    steps: list[StepEvent]
    decode_s: float

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.decode_s / max(len(self.steps), 1)

    @property
    def per_step(self) -> float:
        return len(self.tokens) / max(len(self.steps), 1)


def run_methods(start: Callable[[], Any], prompt_ids: list[int], tokens: int = TOKENS, rounds: int = ROUNDS,
                hold: Callable[[], Any] = contextlib.nullcontext) -> Iterator[tuple[int, int, dict[str, MethodRun]]]:
    """Decode the prompt with every method, `rounds` times in turns, each run on a fresh engine from `start()` (the
    same starting matrix for all) inside `hold()` (the decode slot); yields (runs done, runs in all, the results
    so far)."""
    results: dict[str, MethodRun] = {}
    total = rounds * len(METHODS)
    for r in range(rounds):
        for i, (template, name) in enumerate(METHODS):
            cfg = DecodeConfig(max_new_tokens=tokens, plain=template == "plain",
                               template=HYBRID if template == "plain" else template)
            with hold():
                events = list(start().generate(prompt_ids, cfg))
            summary = events[-1]
            assert isinstance(summary, SummaryEvent)
            steps = [e for e in events if isinstance(e, StepEvent)]
            best = results.get(template)
            if best is None or summary.decode_s < best.decode_s:
                results[template] = MethodRun(template, name, list(summary.tokens), steps, summary.decode_s)
            yield r * len(METHODS) + i + 1, total, results


SHORT = {"plain": "Plain decoding", PAPER: "The paper's 80-node tree", HYBRID: "The hybrid, sized here"}


def side_by_side_html(results: dict[str, MethodRun], machine: str, exact: bool | None) -> str:
    """The paper's method and the hybrid side by side, full width: each one's best step as a tree and its speed,
    then why (tokens a step gains against what a step costs, present/sides.py), plain decoding the yardstick."""
    plain = results.get("plain")
    if plain is None or not all(t in results for t, _ in METHODS):
        return '<div class="tr-sides tr-sides-none">Measuring…</div>'
    cards = "".join(_card(results[t], plain, exact) for t, _ in METHODS[1:])
    same = all(results[t].tokens == plain.tokens for t, _ in METHODS[1:])
    verdict = ("✓ Both answers are plain decoding's, token for token." if same else
               "Not every answer is plain decoding's token for token: see the cards.")
    pays = pays_svg([(SHORT[t], results[t].per_step, step_cost(results[t], plain), speed(results[t], plain))
                     for t, _ in METHODS])
    foot = (f"Your last question, {len(plain.tokens)} tokens each, fastest of {ROUNDS} runs in turns on "
            f"{machine or 'this machine'}; plain decoding {plain.tokens_per_s:.1f} tok/s, a step {plain.step_ms:.0f} ms. Each starts as a new tab "
            "would: the matrix learned beforehand, no conversation to copy from.")
    return (f'<div class="tr-sides tr-sides-open"><div class="tr-sides-top"><span class="tr-sides-title">The '
            f'paper\'s method beside the hybrid</span><span class="tr-sides-verdict">{html.escape(verdict)}</span>'
            f'<button class="tr-sides-close" title="Close">✕</button></div>'
            f'<div class="tr-sides-cards">{cards}</div>'
            f'<div class="tr-sides-why">{pays}</div>'
            f'<div class="tr-sides-foot">{gloss(foot)}{why_paper_slower(results)}</div></div>')


def step_cost(run: MethodRun, plain: MethodRun) -> float:
    """A method's mean step time in plain steps."""
    return run.step_ms / plain.step_ms if plain.step_ms > 0 else 0.0


def speed(run: MethodRun, plain: MethodRun) -> float:
    """A method's speed over plain decoding's: its tokens per second over plain's (for the same tokens, its tokens
    per step over its step cost: the bars say so)."""
    return run.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0


def why_paper_slower(results: dict[str, MethodRun]) -> str:
    """Where the paper's tree lost to plain decoding here, one sentence on why ("" where it did not lose): a CPU's
    forward costs grow with its tokens; the paper's GPUs verify 80 tokens for little more than one."""
    paper, plain = results[PAPER], results["plain"]
    if paper.tokens_per_s >= plain.tokens_per_s or plain.step_ms <= 0:
        return ""
    nodes = max((len(e.tokens) for e in paper.steps), default=0)
    return html.escape(f" The paper's step checks up to {nodes} tokens in one forward: "
                       f"{step_cost(paper, plain):.2f} plain steps here, little more than one on the paper's GPUs "
                       "(about 2× there).")


def _card(run: MethodRun, plain: MethodRun, exact: bool | None) -> str:
    """A method's card: its name and speed, its best step's tree, what that step did, where its drafts came from
    (its tokens per step and step cost are the bars below)."""
    ratio = speed(run, plain)
    best = best_step(run.steps)
    picture = silhouette_svg(best) if best is not None else ""
    did = "" if best is None else (f"its best step: {len(best.tokens) - 1} drafts checked, "
                                   f"{len(best.accepted) - 1} accepted" + (" + the bonus" if best.bonus is not None
                                                                            else ""))
    return (f'<div class="tr-side tr-side-{ratio_class(ratio)}"><div class="tr-side-head">'
            f'<span class="tr-side-name">{html.escape(run.name)}</span>'
            f'<span class="tr-side-big" title="its speed over plain decoding\'s">{ratio:.2f}×</span></div>'
            f'<div class="tr-side-pic">{picture}</div><div class="tr-side-did">{html.escape(did)}</div>'
            f'<div class="tr-side-credit">{gloss(draft_credit(run.steps))} · '
            f'{html.escape(identity_words(run.tokens == plain.tokens, exact))}</div></div>')


ON_ZEROGPU = ("The side-by-side comparison times three methods in this process, which on ZeroGPU has no GPU: run "
              "the studio on your own machine to compare them.")
NEED_QUESTION = "Ask a question first: the comparison answers your last question with both methods."
BUSY_NOW = ("Other visitors' answers are being written: timing three methods now would slow them, and the figures "
            "would favour none fairly. Try again when the page is quiet.")


def compare_methods(s: Any, crowd: Callable[[], int], slot: Callable[[], Any], machine: str) -> Iterator[dict]:
    """The handler: the session's last question answered by each method from the session's warm start (as a new
    tab would answer it: no conversation to copy from), holding the decode slot; yields the status and the panel."""
    question = next((m["content"] for m in reversed(s.history) if m.get("role") == "user"), None)
    if s.engine is None or not isinstance(question, str) or not question.strip():
        yield {"status": NEED_QUESTION}
        return
    if s.answering or crowd() > 0:
        yield {"status": BUSY_NOW}
        return
    if zerogpu.installed():  # each decode there is a GPU call of its own (zerogpu.py); this one runs in-process
        yield {"status": ON_ZEROGPU}
        return
    engine, warm = s.engine, s.warm_state
    ids = engine.encode_chat([{"role": "user", "content": question}])

    def start() -> Any:
        twin = engine.fork()
        if warm is not None:
            twin.restore(warm, keep_costs=True)
        else:
            twin.start_session()
        return twin

    results: dict[str, MethodRun] = {}
    for done, total, results in run_methods(start, ids, hold=slot):  # the slot is free between runs
        if crowd() > 0:
            yield {"status": BUSY_NOW}
            return
        yield {"status": f"Comparing the paper's method with the hybrid: run {done} of {total}…"}
    yield {"sides": side_by_side_html(results, machine, getattr(engine, "exact", None)),
           "status": "✓ The paper's method and the hybrid answered your last question side by side."}
