"""The paper's method beside the hybrid: the session's last question answered by the paper's matrix-only tree and
by the hybrid tree, each timed against plain decoding as the meter times an answer (alternating short turns from the
same start: studio/meter.interleave), so that a card's speed reads as the meter's does; shown side by side with each
method's best step as a tree, its tokens per step against a step's cost, where its accepted drafts came from, and
whether its answer is plain decoding's token for token."""
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
from tr_core.events import StepEvent

from . import zerogpu
from .meter import SpeedEstimate, measure_interleaved

PAPER, HYBRID = "2.2.2", "hybrid"  # the paper's static tree (the matrix alone, 80 nodes), and the studio's default
METHODS = ((PAPER, "The paper's method: the matrix alone, its 80-node tree"),
           (HYBRID, "The hybrid: matrix + context, its tree sized for this machine"))
TOKENS = 128  # new tokens per answer where the last answer's budget is not known (greedy)
MOST_TOKENS = 256  # the comparison answers with the last answer's budget, up to this


@dataclass
class MethodRun:
    """One method's answer: the steps of its first decode (the trees drawn, the drafts credited) and its speed
    against plain decoding, measured in alternating turns (the meter's SpeedEstimate)."""

    template: str
    name: str
    steps: list[StepEvent]
    est: SpeedEstimate

    @property
    def tokens(self) -> list[int]:
        return [t for ev in self.steps for t in ev.emitted]

    @property
    def per_step(self) -> float:
        return len(self.tokens) / max(len(self.steps), 1)

    @property
    def speed(self) -> float | None:
        """Its speed over plain decoding's, where the measurement can be trusted (as the meter shows it)."""
        return self.est.ratio if self.est.trusted and self.est.ratio else None

    @property
    def cost(self) -> float | None:
        """What a step cost, in plain steps: tokens per step over the speed (the meter's reading: 1.83 / 1.06)."""
        return self.per_step / self.speed if self.speed else None


def recorded(events: Iterator[Any], steps: list[StepEvent]) -> Iterator[Any]:
    """`events` as they come, their StepEvents kept in `steps` (closing this closes `events`)."""
    try:
        for ev in events:
            if isinstance(ev, StepEvent):
                steps.append(ev)
            yield ev
    finally:
        events.close()


def run_methods(start: Callable[[], Any], prompt_ids: list[int], tokens: int = TOKENS,
                hold: Callable[[], Any] = contextlib.nullcontext, should_stop: Callable[[], bool] | None = None,
                max_s: float = 30.0, chunk_ms: float = 250.0) -> Iterator[tuple[int, int, dict[str, MethodRun]]]:
    """Time each method against plain decoding on the prompt, in alternating turns from a fresh engine of `start()`
    (the same starting matrix for all), inside `hold()` (the decode slot); yields (methods done, methods in all,
    the results so far)."""
    results: dict[str, MethodRun] = {}
    for i, (template, name) in enumerate(METHODS):
        steps: list[StepEvent] = []
        cfg = DecodeConfig(max_new_tokens=tokens, template=template, provenance=False)

        def runs(record: bool = True) -> tuple[Iterator, Iterator]:
            engine = start()
            tr = engine.generate(prompt_ids, cfg)
            return (recorded(tr, steps) if record else tr), engine.generate(prompt_ids, cfg.with_(plain=True))

        with hold():
            est = measure_interleaved(*runs(), max_s=max_s, chunk_ms=chunk_ms, should_stop=should_stop,
                                      again=lambda: runs(record=False))
        results[template] = MethodRun(template, name, steps, est)
        yield i + 1, len(METHODS), results


def budget(s: Any) -> int:
    """The comparison's new tokens: the last answer's budget (its trace's settings), up to MOST_TOKENS."""
    settings = getattr(getattr(s, "trace", None), "settings", None) or {}
    wanted = settings.get("max_new_tokens")
    return max(1, min(int(wanted), MOST_TOKENS)) if isinstance(wanted, int) else TOKENS


SHORT = {PAPER: "The paper's 80-node tree", HYBRID: "The hybrid, sized here"}


def side_by_side_html(results: dict[str, MethodRun], machine: str, exact: bool | None, tokens: int = TOKENS) -> str:
    """The paper's method and the hybrid side by side, full width: each one's best step as a tree and its speed,
    then why (tokens a step gains against what a step costs, present/sides.py), plain decoding the yardstick."""
    if not all(t in results for t, _ in METHODS):
        return '<div class="tr-sides tr-sides-none">Measuring…</div>'
    runs = [results[t] for t, _ in METHODS]
    cards = "".join(_card(run, exact) for run in runs)
    same = all(run.est.identical for run in runs)
    verdict = ("✓ Both answers are plain decoding's, token for token." if same else
               "Not every answer is plain decoding's token for token: see the cards.")
    bars = [("Plain decoding", 1.0, 1.0, 1.0)] + [(SHORT[r.template], r.per_step, r.cost, r.speed) for r in runs
                                                  if r.speed]
    foot = (f"Your last question, up to {tokens} new tokens, on {machine or 'this machine'}: each method timed against "
            "plain decoding in alternating short turns, as the meter times an answer. Each starts as a new tab "
            "would: the matrix learned beforehand, no conversation to copy from.")
    return (f'<div class="tr-sides tr-sides-open"><div class="tr-sides-top"><span class="tr-sides-title">The '
            f'paper\'s method beside the hybrid</span><span class="tr-sides-verdict">{html.escape(verdict)}</span>'
            f'<button class="tr-sides-close" title="Close">✕</button></div>'
            f'<div class="tr-sides-cards">{cards}</div>'
            f'<div class="tr-sides-why">{pays_svg(bars)}</div>'
            f'<div class="tr-sides-foot">{gloss(foot)}{why_paper_slower(results[PAPER])}</div></div>')


def why_paper_slower(paper: MethodRun) -> str:
    """Where the paper's tree lost to plain decoding here, one sentence on why ("" where it did not, or was not
    measured): a CPU's forward costs grow with its tokens; the paper's GPUs verify 80 tokens for little more."""
    if paper.speed is None or paper.speed >= 1.0 or paper.cost is None:
        return ""
    nodes = max((len(e.tokens) for e in paper.steps), default=0)
    return html.escape(f" The paper's step checks up to {nodes} tokens in one forward: {paper.cost:.2f} plain steps "
                       "here. On the paper's GPUs such a forward costs little more than one step, and the paper "
                       "reports about 2× plain decoding's speed there (not measured here).")


def _card(run: MethodRun, exact: bool | None) -> str:
    """A method's card: its name and speed, the tree of its step that gained the most, where its drafts came from
    (its tokens per step and step cost are the bars below)."""
    best = best_step(run.steps)
    picture = silhouette_svg(best) if best is not None else ""
    did = "" if best is None else (f"its step that gained the most: {len(best.accepted) - 1} of "
                                   f"{len(best.tokens) - 1} drafts accepted" + (" + the bonus" if best.bonus is not None
                                                                               else ""))
    est = run.est
    big = (f'{run.speed:.2f}×<span class="tr-side-err"> ± {est.error:.2f}</span>' if run.speed else
           '<span class="tr-side-noisy">too noisy to measure</span>')
    return (f'<div class="tr-side tr-side-{ratio_class(run.speed or 1.0, est.error or 0.0)}"><div class="tr-side-head">'
            f'<span class="tr-side-name">{html.escape(run.name)}</span>'
            f'<span class="tr-side-big" title="its speed over plain decoding\'s">{big}</span></div>'
            f'<div class="tr-side-pic">{picture}</div><div class="tr-side-did">{html.escape(did)}</div>'
            f'<div class="tr-side-credit">{gloss(draft_credit(run.steps))} · '
            f'{html.escape(identity_words(est.identical, exact))}</div></div>')


ON_ZEROGPU = ("The side-by-side comparison times three methods in this process, which on ZeroGPU has no GPU: run "
              "the studio on your own machine to compare them.")
NEED_QUESTION = "Ask a question first: the comparison answers your last question with both methods."
BUSY_NOW = ("Other visitors' answers are being written: timing three methods now would slow them, and the figures "
            "would favour none fairly. Try again when the page is quiet.")


def compare_methods(s: Any, crowd: Callable[[], int], slot: Callable[[], Any], machine: str, max_s: float = 30.0,
                    chunk_ms: float = 250.0) -> Iterator[dict]:
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
    tokens, busy = budget(s), lambda: crowd() > 0
    yield {"status": f"Timing the paper's method against plain decoding (1 of {len(METHODS)})…"}
    for done, total, results in run_methods(start, ids, tokens, slot, busy, max_s, chunk_ms):  # slot free between
        if busy():
            yield {"status": BUSY_NOW}
            return
        if done < total:
            yield {"status": f"Timing the hybrid against plain decoding ({done + 1} of {total})…"}
    yield {"sides": side_by_side_html(results, machine, getattr(engine, "exact", None), tokens),
           "status": "✓ The paper's method and the hybrid answered your last question side by side."}
