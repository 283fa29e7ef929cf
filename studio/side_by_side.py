"""The paper vs the hybrid (TITLE), on the visitor's last answer: its prompt, from the state it started
from, with its settings, decoded with the paper's 80-node tree, the same drafting in a tree sized for this machine,
and the hybrid tree, each timed against plain decoding as the meter times an answer (alternating short turns from
the same start: studio/meter.interleave). Where the answer itself used one of the three trees and the meter
measured it, it is that card, so the card and the meter show one figure. Shown side by side: each method's telling
step as a tree (the page's rule), its tokens per step against a step's cost, where its accepted drafts came from,
and whether it is plain decoding's token for token."""
from __future__ import annotations

import contextlib
import html
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from present.chart import draft_credit
from present.glossary import gloss
from present.meter import METHOD_NAMES, identity_words, ratio_class
from present.sides import best_step, pays_svg, silhouette_svg
from present.tour import step_cost, telling_index, tour_html
from tr_core.config import DecodeConfig
from tr_core.events import StepEvent
from tr_core.trace import Trace

from . import zerogpu
from .meter import SpeedEstimate, measure_interleaved

# the paper's static tree (the matrix alone, 80 nodes); the same drafting in a tree sized for this machine; and the
# studio's default, which also copies: one change at a time, from the paper's method to the hybrid
PAPER, SIZED, HYBRID = "2.2.2", "adaptive", "hybrid"
METHODS = ((PAPER, "Paper's 80-node tree: the paper's method, the matrix alone"),
           (SIZED, "Matrix only: the paper's drafting, its tree sized each step for this machine"),
           (HYBRID, "Matrix + context, the hybrid: also copies earlier text, its tree sized each step"))
TITLE = "The paper vs the hybrid"  # the comparison's one name: its button, its panel, its status line and the README
MOST_TOKENS = 256  # the comparison decodes with the last answer's token budget, up to this


@dataclass
class MethodRun:
    """One method's answer: its steps (the trees drawn, the drafts credited) and its speed against plain decoding,
    measured in alternating turns (the meter's SpeedEstimate); `own`: the visitor's answer itself, as the meter
    measured it, not a run made for the comparison."""

    template: str
    name: str
    steps: list[StepEvent]
    est: SpeedEstimate
    own: bool = False

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


def run_methods(start: Callable[[], Any], prompt_ids: list[int], cfg: DecodeConfig, have: dict[str, MethodRun],
                hold: Callable[[], Any] = contextlib.nullcontext, should_stop: Callable[[], bool] | None = None,
                max_s: float = 30.0, chunk_ms: float = 250.0) -> Iterator[tuple[int, int, dict[str, MethodRun]]]:
    """Time each method not in `have` against plain decoding on the prompt with `cfg` (its tree swapped), in
    alternating turns from a fresh engine of `start()` (the same start for all), inside `hold()` (the decode slot);
    yields (methods done, methods in all, the results so far, `have`'s among them)."""
    results = dict(have)
    todo = [(t, name) for t, name in METHODS if t not in have]
    for i, (template, name) in enumerate(todo):
        steps: list[StepEvent] = []
        own = cfg.with_(template=template, plain=False, provenance=False)

        def runs(record: bool = True) -> tuple[Iterator, Iterator]:
            # the recorded pass keeps what the card's tour shows (the rows each step read: provenance), at +0.30 ms
            # a step of the paper's tree (~0.2% of its step) and +0.05 ms of a sized one (scripts/microscope_overhead)
            engine = start()
            tr = engine.generate(prompt_ids, own.with_(provenance=record))
            return (recorded(tr, steps) if record else tr), engine.generate(prompt_ids, own.with_(plain=True))

        with hold():
            est = measure_interleaved(*runs(), max_s=max_s, chunk_ms=chunk_ms, should_stop=should_stop,
                                      again=lambda: runs(record=False))
        results[template] = MethodRun(template, name, steps, est)
        yield i + 1, len(todo), results


def own_run(trace: Any) -> MethodRun | None:
    """The visitor's last answer as a card, where it used one of the compared trees and the meter measured it."""
    settings = getattr(trace, "settings", None) or {}
    names = dict(METHODS)
    if (not trace or not trace.steps or not trace.speed or settings.get("plain")
            or settings.get("template") not in names):
        return None
    return MethodRun(settings["template"], names[settings["template"]], list(trace.steps),
                     SpeedEstimate(**trace.speed), own=True)  # as the meter reads it back (views.trace_meter)


def method_trace(run: MethodRun, answer: Trace, token_text: Callable[[int], str]) -> Trace:
    """A method's run as a trace the guided tour reads: the answer's conversation and settings with the method's
    tree, its steps, and its measurement against plain decoding (its cost curve: a step of each size it timed). The
    visitor's own answer is its card's trace."""
    if run.own:
        return answer
    trace = Trace(model=answer.model, settings={**answer.settings, "template": run.template, "plain": False},
                  messages=list(answer.messages), speed=asdict(run.est))
    trace.record_texts(token_text, run.steps)
    trace.steps = list(run.steps)
    return trace


def card_tour(run: MethodRun, answer: Trace | None, token_text: Callable[[int], str]) -> str:
    """The guided tour of a card's step (the one its tree draws), as markup that stays closed until its button."""
    if answer is None or not run.steps:
        return ""
    return tour_html(method_trace(run, answer, token_text), telling_index(run.steps))  # its recorded texts


SHORT = {t: METHOD_NAMES[t] for t in (PAPER, SIZED, HYBRID)}  # as the drafting choices name them


def side_by_side_html(results: dict[str, MethodRun], machine: str, exact: bool | None, tokens: int,
                      tour: Callable[[MethodRun], str] = lambda run: "") -> str:
    """The paper's method and the hybrid side by side, full width: each one's telling step as a tree and its speed
    (with `tour(run)`: the guided tour of that step behind a button), then why (tokens a step gains against what a
    step costs, present/sides.py), plain decoding the yardstick."""
    if not all(t in results for t, _ in METHODS):
        return '<div class="tr-sides tr-sides-none">Measuring…</div>'
    runs = [results[t] for t, _ in METHODS]
    longest = max(len(run.tokens) for run in runs)
    cards = "".join(_card(run, exact, tour(run), longest) for run in runs)
    same = all(run.est.identical for run in runs)
    verdict = (f"✓ All {len(runs)} answers are plain decoding's, token for token." if same else
               "Not every answer is plain decoding's token for token: see the cards.")
    bars = [("Plain decoding", 1.0, 1.0, 1.0)] + [(SHORT[r.template], r.per_step, r.cost, r.speed) for r in runs
                                                  if r.speed]
    foot = (f"All from your last answer's start: the same conversation, matrix and settings, up to {tokens} new "
            f"tokens, on {machine or 'this machine'}; each timed against plain decoding in alternating short turns, "
            "as the meter times an answer (±: one standard error).")
    return (f'<div class="tr-sides tr-sides-open"><div class="tr-sides-top"><span class="tr-sides-title">{TITLE}</span>'
            f'<span class="tr-sides-verdict">{html.escape(verdict)}</span>'
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
    return html.escape(f" The paper's step checks up to {nodes} tokens in one forward: "
                       f"{step_cost(paper.per_step, paper.speed)} plain steps "
                       "here. On the paper's GPUs such a forward costs little more than one step, and the paper "
                       "reports about 2× plain decoding's speed there (not measured here).")


def _card(run: MethodRun, exact: bool | None, tour: str = "", longest: int = 0) -> str:
    """A method's card: its name and speed, whose answer it is, the tree of its step with the most matrix drafts
    accepted (the page's rule), where its drafts came from (its tokens per step and step cost are the bars below),
    and, where the time cap stopped it before the longest of the answers, how far it got (a reader divided the whole
    answer by its steps)."""
    best = best_step(run.steps)
    picture = silhouette_svg(best) if best is not None else ""
    did = "" if best is None else (f"step {best.step + 1} (most drafts from the matrix alone accepted): "
                                   f"{len(best.accepted) - 1} of {len(best.tokens) - 1} drafts accepted"
                                   + (" + the bonus" if best.bonus is not None else ""))
    if len(run.tokens) < longest:
        did += f" · timed over its first {len(run.tokens)} of {longest} tokens in {len(run.steps)} steps (time cap)"
    est = run.est
    big = (f'{run.speed:.2f}×<span class="tr-side-err"> ± {est.error:.2f}</span>' if run.speed else
           '<span class="tr-side-noisy">too noisy to measure</span>')
    whose = "your answer above, as its meter measured it" if run.own else "decoded now, from the same start"
    return (f'<div class="tr-side tr-side-{ratio_class(run.speed or 1.0, est.error or 0.0)}"><div class="tr-side-head">'
            f'<span class="tr-side-big" title="its speed over plain decoding\'s">{big}</span>'
            f'<span class="tr-side-name">{html.escape(run.name)}<span class="tr-side-whose">{whose}</span></span></div>'
            f'<div class="tr-side-pic">{picture}</div><div class="tr-side-did">{html.escape(did)}</div>'
            f'<div class="tr-side-credit">{gloss(draft_credit(run.steps))} · '
            f'{html.escape(identity_words(est.identical, exact))}</div>{_tour_button(tour)}</div>')


def _tour_button(tour: str) -> str:
    """A card's "Tour this step" button and its tour (studio/page_js.SIDES_INSTALL_JS opens it), or ""."""
    return (f'<button type="button" class="tr-side-tour" title="the guided tour of this step, seven screens">▶ Tour '
            f'this step</button>{tour}' if tour else "")


ON_ZEROGPU = ("The side-by-side comparison times three methods in this process, which on ZeroGPU has no GPU: run "
              "the studio on your own machine to compare them.")
NEED_QUESTION = "Ask a question first: the comparison answers your last question with each method."
BUSY_NOW = ("Other visitors' answers are being written: timing three methods now would slow them, and the figures "
            "would favour none fairly. Try again when the page is quiet.")


def compare_methods(s: Any, crowd: Callable[[], int], slot: Callable[[], Any], machine: str, max_s: float = 30.0,
                    chunk_ms: float = 250.0) -> Iterator[dict]:
    """The handler: the three trees on the session's last answer's prompt, from the state it started from, with its
    settings; the answer itself is one of the cards where it used one of the three trees and the meter measured
    it. Holds the decode slot per measurement; yields the status and the panel."""
    begun = s.last_start
    if s.engine is None or begun is None:
        yield {"status": NEED_QUESTION}
        return
    if s.answering or crowd() > 0:
        yield {"status": BUSY_NOW}
        return
    if zerogpu.installed():  # each decode there is a GPU call of its own (zerogpu.py); this one runs in-process
        yield {"status": ON_ZEROGPU}
        return
    engine, ids, cfg = begun
    cfg = cfg.with_(max_new_tokens=min(cfg.max_new_tokens, MOST_TOKENS))
    own = own_run(s.trace)
    have = {own.template: own} if own is not None and len(own.tokens) <= cfg.max_new_tokens else {}
    results, busy = dict(have), lambda: crowd() > 0
    todo = [SHORT[t] for t, _ in METHODS if t not in have]  # the drafting choices' names
    if todo:
        yield {"status": f"Timing {todo[0]} against plain decoding…"}
    for done, total, results in run_methods(engine.fork, ids, cfg, have, slot, busy, max_s, chunk_ms):
        if busy():
            yield {"status": BUSY_NOW}
            return
        if done < total:
            yield {"status": f"Timing {todo[done]} against plain decoding…"}
    tour = lambda run: card_tour(run, s.trace, engine.token_text)  # noqa: E731 - one card's tour
    yield {"sides": side_by_side_html(results, machine, getattr(engine, "exact", None), cfg.max_new_tokens, tour),
           "status": f"✓ {TITLE}: your last question, answered three ways."}
