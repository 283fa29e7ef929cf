"""The studio's handlers: plain functions of (studio, session, inputs) that return views (dicts keyed by views.KEYS).

No Gradio here: the page (page.py) turns views into component updates, and tests call these directly.
Everything a visitor sends is validated before the session changes; every decode holds DECODE_SLOT and
belongs to the request that started it (closing the generator stops it within one step).
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tr_core.config import DecodeConfig, DecodeConfigError
from tr_core.events import StepEvent, SummaryEvent
from present.figures import MatrixTracker, accepted_chart_explained, heatmap_figure, tree_figure
from tr_core.bench.meter import MAX_PASSES, SpeedEstimate, answer_sizes, forked, interleave
from studio.recording import record_live
from tr_core.trace import Trace, TraceError

from . import zerogpu
from .config import StudioConfig
from .models import REFUSED, ModelCatalog, ModelRefused, label
from .session import DECODE_SLOT, InputError, PausingEngine, Session, SlotAbandoned, clean_text, decode_slot, take_slot
from .views import (MEASURE_HINT, RACE_WAIT, STOPPED_HINT, CostCurve, best_step, blank_views, coloured_answer,
                    cost_html, coverage_note, decoding_html, done_status, left_out_note, live_meter, marked_chat,
                    matrix_info, measured_meter, message, meter_curve, microscope_html, race_html, replay_slider,
                    step_story_view, step_views, trace_meter)

RENDER_EVERY_S = 0.25  # redraw figures at most this often while streaming
LIMITS = dict(max_new_tokens=(1, 1024), temperature=(0.0, 2.0), top_p=(0.05, 1.0), top_k=(0, 1000), seed=(0, 2**31 - 1),
              k=(1, 16), delay=(0.0, 3.0), repetition_penalty=(0.5, 2.0))
BUSY = "An answer is running in this tab: press Stop (or wait for it to finish) first."
ANSWERING = "the answer is still being written"  # the race panel while an answer runs
NOT_MEASURED = "this answer ended early (stopped, or failed), so it was not measured against plain decoding"


@dataclass
class Studio:
    """What handlers need besides the session: the operator's settings, the shared models, the default tree."""

    config: StudioConfig
    catalog: ModelCatalog
    default_template: str = "hybrid"  # the template a new page shows (app.py: the benchmark's winner on the device)
    warm: threading.Event = dataclasses.field(default_factory=lambda: _set_event())  # cleared during warm-up
    # measured forward cost curves by (model, drafter): timed once on this machine, copied into every later engine
    costs: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    # how many times a curve timed on a busy machine was thrown away to be timed again, by (model, drafter)
    retimed: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    preparing: str = ""  # what the preload is doing while `warm` is cleared (e.g. learning a warm start), for the page


MAX_RETIMES = 3  # a machine busy this often keeps its unsteady curve, flagged as such on the page


def steady(cost: Any) -> bool:
    """Whether a measured cost curve was timed on a quiet machine (ForwardCost.steady; True where not known)."""
    return bool(getattr(cost, "steady", True))


def share_costs(studio: Studio, model: str, engine: Any, before_answer: bool = False) -> None:
    """One timing of this machine's forwards per model, for every session: an engine whose cost-sized drafters have
    measured a steady curve leaves a copy with the studio, and one that has not takes a copy before it answers (else
    each visitor's first adaptive or hybrid answer would pause seconds to time the forwards again). A curve timed
    while the machine was busy is never shared: `before_answer`, the engine drops it to time the forwards again in
    that answer (up to MAX_RETIMES per model), after which it is kept for that session only and the page flags it."""
    for name in ("adaptive", "hybrid"):
        drafter = getattr(engine, name, None)
        cost = getattr(drafter, "cost", None)
        if cost is None:
            continue
        key = (model, name)
        known = studio.costs.get(key)
        if cost.measured and steady(cost):
            studio.costs.setdefault(key, copy.deepcopy(cost))
        elif known is not None:
            drafter.cost = copy.deepcopy(known)
        elif before_answer and cost.measured and studio.retimed.get(key, 0) < MAX_RETIMES:
            studio.retimed[key] = studio.retimed.get(key, 0) + 1
            drafter.cost = type(cost)()  # unmeasured: the next answer times the forwards again


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass(frozen=True)
class ChatSettings:
    """A chat request's decoding settings, as validated (see `parse_settings`)."""

    max_new_tokens: int = 128  # longest answer
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus threshold
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; applied to every tree node with its own prefix
    seed: int = 0  # sampling seed
    template: str = ""  # draft tree template ("" = the studio's default)
    k: int = 8  # candidates per matrix row
    compare: bool = True  # measure the speedup against plain decoding after the answer
    delay: float = 0.0  # slow motion: pause per step (s)
    colour: bool = True  # colour each step's accepted run in the chat


def clamp(name: str, value: Any, notes: list[str], cast=float) -> Any:
    """Clamp a setting into its range (noting it), treating empty or unreadable input as the range's low end."""
    lo, hi = LIMITS[name]
    try:
        v = float(value)
        if v != v:  # NaN
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        notes.append(f"{name} {str(value)[:20]!r} is not a number; using {lo}.")
        return cast(lo)
    if v < lo or v > hi:
        notes.append(f"{name} = {str(value)[:20]} is outside [{lo}, {hi}]; clamped.")
    return cast(min(max(v, lo), hi))


def parse_settings(studio: Studio, raw: dict[str, Any], notes: list[str]) -> ChatSettings:
    """Validate the page's (or an API caller's) settings: clamp numbers, check the template, apply the caps."""
    from tr_core.tree import TEMPLATE_NAMES

    cfg = studio.config
    template = raw.get("template") or studio.default_template
    if template not in TEMPLATE_NAMES:
        notes.append(f"Unknown template {str(template)[:40]!r}; using {studio.default_template}.")
        template = studio.default_template
    max_new = clamp("max_new_tokens", raw.get("max_new_tokens", 128), notes, int)
    if max_new > cfg.max_new_tokens:
        notes.append(f"Max new tokens capped at {cfg.max_new_tokens} on this instance.")
        max_new = cfg.max_new_tokens
    delay = clamp("delay", raw.get("delay", 0.0), notes)
    if delay > cfg.max_delay_s:
        notes.append(f"Slow motion capped at {cfg.max_delay_s:g} s per step on this instance.")
        delay = cfg.max_delay_s
    top_p = raw.get("top_p", 1.0)
    return ChatSettings(max_new_tokens=max_new, temperature=clamp("temperature", raw.get("temperature", 0.0), notes),
                        top_p=clamp("top_p", top_p, notes) if top_p not in (None, "", 0) else 1.0,
                        top_k=clamp("top_k", raw.get("top_k", 0), notes, int),
                        repetition_penalty=clamp("repetition_penalty", raw.get("repetition_penalty", 1.0), notes),
                        seed=clamp("seed", raw.get("seed", 0), notes, int), template=template,
                        k=clamp("k", raw.get("k", 8), notes, int), compare=bool(raw.get("compare", True)),
                        delay=delay, colour=bool(raw.get("colour", True)))


def trim_to_context(encode, messages: list[dict[str, str]], limit: int, max_new: int) -> tuple[list[int], int, int]:
    """Drop the oldest turns until prompt + answer fit the context; return (ids, turns dropped, max_new)."""
    dropped = 0
    msgs = list(messages)
    ids = encode(msgs)
    while len(ids) + max_new > limit and len(msgs) > 1:
        cut = 2 if len(msgs) > 2 and msgs[0]["role"] == "user" else 1
        msgs = msgs[cut:]
        dropped += cut
        ids = encode(msgs)
    if len(ids) + max_new > limit:
        max_new = limit - len(ids)
        if max_new < 1:
            raise InputError(f"the message alone is {len(ids)} tokens, longer than the model's context ({limit}); "
                             "shorten it")
    return ids, dropped, max_new


def summary_from_steps(steps: list[StepEvent], prompt_tokens: int, template: str, reason: str) -> SummaryEvent:
    """A summary from step timings alone (an answer stopped before the engine's summary, or slowed by pauses)."""
    tokens = [t for e in steps for t in e.emitted]
    decode_s = sum(e.timings.get("total", 0.0) for e in steps) / 1000.0
    return SummaryEvent(tokens=tokens, prompt_tokens=prompt_tokens, new_tokens=len(tokens), steps=len(steps),
                        mean_accepted=len(tokens) / max(len(steps), 1),
                        tokens_per_s=len(tokens) / decode_s if decode_s else 0.0, prefill_s=0.0, decode_s=decode_s,
                        wall_s=decode_s, stop_reason=reason, method="recycling", template=template,
                        matrix_rows_filled=0, matrix_mb=0.0)


# ------------------------------------------------------------------------------------------------ chat


NO_WARM = "The matrix starts empty (no warm start is available for this model)."
_WARM_STARTS: "weakref.WeakKeyDictionary[Any, tuple[dict | None, str]]" = weakref.WeakKeyDictionary()


def warm_up(engine: Any, model_name: str, learn: bool,
            progress: Callable[[int, int], None] | None = None) -> tuple[dict | None, str]:
    """Start `engine`'s matrix warm (tr_core.warm: the embedded model's shipped start, else one learned once from
    the project's own questions and cached; never from visitors). Returns (the engine's state right after it, for
    Reset; None when nothing was loaded) and a plain-English line for the page."""
    from tr_core.warm import WarmStartError, warm_start

    try:
        info = warm_start(engine, model_name, learn=learn, progress=progress)
    except WarmStartError as exc:  # a shipped file that does not fit this model: the session still works, cold
        return None, f"Cold start: the matrix starts empty (the warm-start file cannot be used: {exc})"
    if info.source == "none":
        return None, info.describe() or NO_WARM
    return engine.snapshot(), info.describe()


def new_engine(studio: Studio, model_name: str, k: int, should_stop: Callable[[], bool] | None = None,
               progress: Callable[[int, int], None] | None = None) -> Any:
    """A new engine for a model, warm-started. The model load waits on no one (it may wait on the network, and
    other tabs' decoding must not wait on it); building the engine and its warm start (forwards, when learned)
    hold the decode slot, so they never run beside another tab's timed decode."""
    from tr_core.engine import Engine

    model, tokenizer = studio.catalog.get(model_name)
    with decode_slot(should_stop):
        engine = Engine(model, tokenizer, topk_candidates=k)
        # on ZeroGPU the app's copy is on the CPU: a warm start is only loaded there, never learned
        _WARM_STARTS[engine] = warm_up(engine, model_name, learn=not zerogpu.on_zerogpu(), progress=progress)
    return engine


def engine_for(studio: Studio, s: Session, k: int, should_stop: Callable[[], bool] | None = None,
               progress: Callable[[int, int], None] | None = None) -> Any:
    """The session's engine when it has k candidates per row, else a new warm-started one (not yet the
    session's: see adopt_engine)."""
    if s.engine is not None and k == s.k:
        return s.engine
    return new_engine(studio, s.model, k, should_stop, progress)


def adopt_engine(s: Session, engine: Any, notes: list[str], change_note: str) -> None:
    """Make `engine` the session's (with its warm start, for Reset); `change_note` is added when it replaces an
    engine with another k."""
    if engine is not s.engine:
        if s.engine is not None:
            notes.append(change_note)
        s.engine, s.k = engine, engine.matrix.k
        s.warm_state, s.warm_note = _WARM_STARTS.get(engine, (None, NO_WARM))


def ensure_engine(studio: Studio, s: Session, k: int, notes: list[str],
                  should_stop: Callable[[], bool] | None = None) -> Any:
    """The session's engine, created on first use or when k changed (a new k needs a new matrix)."""
    engine = engine_for(studio, s, k, should_stop)
    adopt_engine(s, engine, notes, f"Candidates per row changed to k = {k}: the adjacency matrix starts again "
                                   "from its warm start.")
    return engine


def respond(studio: Studio, s: Session, text: Any, settings: ChatSettings, notes: list[str]) -> Iterator[dict]:
    """Answer one chat message with Token Recycling, streaming views; then measure the speedup if asked."""
    try:
        text = clean_text(text, "message", studio.config.max_message_chars).strip()
    except InputError as exc:
        yield {"status": f"✗ {exc}"}
        return
    if not text:
        yield {"status": "Type a message first (or click an example)."}
        return
    with s.lock:
        if s.answering:
            yield {"status": f"✗ {BUSY}"}
            return
        stop = s.answer_stop = threading.Event()
        conversation = s.conversation
    try:
        yield from _answer(studio, s, text, settings, notes, stop, conversation)
    finally:
        with s.lock:
            if s.answer_stop is stop:
                s.answer_stop = None


def _prepare(studio: Studio, s: Session, text: str, settings: ChatSettings, notes: list[str]):
    """(engine, prompt ids, messages, DecodeConfig) for a message: loads the model, trims the conversation."""
    engine = ensure_engine(studio, s, settings.k, notes)
    history = s.history
    if len(history) > studio.config.max_turns:
        history = history[-studio.config.max_turns:]
        notes.append(f"⚠ Long conversation: only the last {studio.config.max_turns} turns are kept.")
    messages = history + [{"role": "user", "content": text}]
    ids, dropped, max_new = trim_to_context(engine.encode_chat, messages, engine.context_limit, settings.max_new_tokens)
    if dropped:
        oldest = "message was" if dropped == 1 else f"{dropped} messages were"
        notes.append(f"⚠ The conversation is longer than the model's context ({engine.context_limit} tokens): "
                     f"the oldest {oldest} left out of the prompt.")
    if max_new < settings.max_new_tokens:
        notes.append(f"Max new tokens reduced to {max_new} to fit the context.")
    cfg = DecodeConfig(max_new_tokens=max_new, temperature=settings.temperature, top_p=settings.top_p,
                       top_k=settings.top_k, repetition_penalty=settings.repetition_penalty, seed=settings.seed,
                       template=settings.template)
    return engine, ids, messages, cfg


PRELOAD_WAIT_S = 300.0  # an answer waits this long at most for the preload before it loads the model itself
WARMING = "Learning a warm start for this model from the project's own questions (once; then cached): {} of {}…"


def _set_up(studio: Studio, s: Session, k: int, notes: list[str], stop: threading.Event) -> Iterator[dict]:
    """Wait for the preload (at most PRELOAD_WAIT_S), then create the session's engine when it has none for k,
    yielding what the preload does and the warm start's progress while one is learned (once per model and machine)."""
    waited_until = time.monotonic() + PRELOAD_WAIT_S
    while not studio.warm.wait(RENDER_EVERY_S) and time.monotonic() < waited_until and not stop.is_set():
        if studio.preparing:
            yield {"status": studio.preparing}
    if s.engine is not None and k == s.k:
        return
    done: list[int] = [0, 0]
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            out["engine"] = engine_for(studio, s, k, stop.is_set, lambda i, n: done.__setitem__(slice(None), [i, n]))
        except BaseException as exc:  # noqa: BLE001 - raised again in the request's thread
            out["error"] = exc

    worker = threading.Thread(target=work, daemon=True, name="tr-engine-setup")
    worker.start()
    while worker.is_alive():
        worker.join(RENDER_EVERY_S)
        if done[1]:
            yield {"status": WARMING.format(*done)}
    if "error" in out:
        raise out["error"]
    adopt_engine(s, out["engine"], notes, f"Candidates per row changed to k = {k}: the adjacency matrix starts "
                                          "again from its warm start.")
    yield {"warm": s.warm_note, "matrix": matrix_info(s.engine, s.k)}


# the decode slot may be held by the app's start-up, another visitor's answer or speed measurement, or this tab's own
SLOT_ABANDONED = ("■ Stopped before decoding began: the model was still busy (starting up, or with another answer or "
                  "speed measurement); nothing was changed.")


def _error_text(studio: Studio, exc: BaseException) -> str:
    """A failure as the visitor sees it: public instances never echo server details."""
    if isinstance(exc, (InputError, ModelRefused, DecodeConfigError)):  # about the visitor's input, nothing else
        return f"✗ {exc}"
    if isinstance(exc, SlotAbandoned):
        return SLOT_ABANDONED
    if studio.config.public:
        return "✗ The model could not be used right now; please try again later."
    return f"✗ {type(exc).__name__}: {exc}"


PROBING = ("Timing this machine's forwards of every size, once for this model (a few seconds on a CPU): which matrix "
           "product is faster here, and what each draft size costs for the adaptive and hybrid trees…")


def _answer(studio: Studio, s: Session, text: str, settings: ChatSettings, notes: list[str],
            stop: threading.Event, conversation: int) -> Iterator[dict]:
    """The body of `respond`, once the session is marked as answering."""
    pending = s.display + [message("user", text), {"role": "assistant", "content": "…"}]
    yield {"chat": pending, "msg": "", "status": "Loading the model…" if s.engine is None else "Drafting…",
           "race": race_html(None, wait=ANSWERING)}
    try:
        yield from _set_up(studio, s, settings.k, notes, stop)
        engine, ids, messages, cfg = _prepare(studio, s, text, settings, notes)
        share_costs(studio, s.model, engine, before_answer=True)  # any engine, model or tree: the costs timed here
        probing = engine.times_forwards_first(cfg)
    except Exception as exc:  # noqa: BLE001 - model load / settings errors are shown, the session goes on
        yield {"chat": s.display, "msg": text, "status": _error_text(studio, exc), "matrix": matrix_info(s.engine, s.k)}
        return
    if probing:
        yield {"status": PROBING}
    twin = forked(engine) if settings.compare else None  # the state this answer starts from, for the measurement
    trace = Trace(model=label(s.model), settings=dict(dataclasses.asdict(cfg), k=settings.k), messages=messages)
    try:
        error = yield from _stream(studio, s, engine, ids, cfg, trace, settings, stop, conversation, pending, notes)
    finally:  # a probe this answer ran serves every later engine, even when the visitor left mid-answer
        share_costs(studio, s.model, engine)
    _finish_trace(trace, engine, ids, cfg, settings, error, notes)
    stopped = was_cut(trace)
    with s.lock:
        current = s.conversation == conversation
        if current and trace.steps:
            s.history = messages + [{"role": "assistant", "content": trace.answer}]
            s.display = pending[:-1] + [{"role": "assistant", "content": coloured_answer(trace, colour=settings.colour)}]
            s.trace = trace
        elif current:  # nothing generated: keep the message out of the conversation the model sees
            s.display = pending[:-2]
    if not current:
        yield _dropped_view(s)
        return
    measure = settings.compare and trace.steps and error is None and not stopped
    final = _final_view(s, trace, settings, notes, compared=bool(measure))
    if measure:
        final["status"] = "  \n".join(notes + ["Measuring the speedup: both methods in turns on the same tokens…"])
        yield final
        for view in _measure(studio, s, twin, ids, cfg, trace, stop, settings, notes):
            if s.conversation != conversation:  # New chat while measuring: the answer is gone from the page
                yield _dropped_view(s)
                return
            yield view
    else:
        yield final


def _dropped_view(s: Session) -> dict:
    """After New chat was pressed while this answer (or its measurement) ran."""
    return {**blank_views(), "chat": s.display,
            "status": "New conversation (the answer that was running was stopped and dropped)."}


def _stream(studio: Studio, s: Session, engine: Any, ids: list[int], cfg: DecodeConfig, trace: Trace,
            settings: ChatSettings, stop: threading.Event, conversation: int, pending: list[dict],
            notes: list[str]) -> Iterator[dict]:
    """Decode the answer in the engine thread, yielding live views; returns the engine's error, if any."""
    text_of = trace.cached_text(engine.token_text)
    tracker = MatrixTracker()
    curve = cost_curve(s, None)
    note_md = "  \n".join(notes)
    decoder = zerogpu.RemoteEngine(engine, s.model, studio.config.time_limit_s) if zerogpu.installed() else engine
    # the slot is taken by the engine itself, so that slow motion's pauses leave it to other tabs
    live = record_live(PausingEngine(decoder, pause=settings.delay > 0), ids, cfg, trace, stop, RENDER_EVERY_S,
                       settings.delay, time_limit_s=studio.config.time_limit_s)
    try:
        for new_steps in live:
            if s.conversation != conversation:  # New chat: stop this answer (closing record_live stops the engine)
                break
            for ev in new_steps:
                before = tracker.update(ev)  # the last step's story compares its rows with these
            last = trace.steps[-1]
            shown = coloured_answer(trace, colour=settings.colour)
            yield {"chat": pending[:-1] + [{"role": "assistant", "content": shown + " ▌"}],
                   "tree": tree_figure(last, text_of), "heat": heatmap_figure(tracker, last, text_of),
                   "story": step_story_view(last, text_of, before), "cost": cost_html(last, curve, trace),
                   "microscope": microscope_html(trace, last.step), "decoding": decoding_html(trace.settings),
                   "chart": accepted_chart_explained(trace.steps), "meter": live_meter(trace, settings.compare),
                   "status": note_md or f"Step {last.step + 1} · {sum(len(e.emitted) for e in trace.steps)} tokens"}
    except Exception as exc:  # noqa: BLE001 - shown in the page; the session goes on
        traceback.print_exception(exc)
        return exc
    finally:
        live.close()  # the decode belongs to this request: stop the engine thread and join it
    return None


def _finish_trace(trace: Trace, engine: Any, ids: list[int], cfg: DecodeConfig, settings: ChatSettings,
                  error: BaseException | None, notes: list[str]) -> None:
    """Token strings, a summary for stopped or slowed answers, and the notes that explain them."""
    trace.record_texts(engine.token_text)
    reason = trace.summary.stop_reason if trace.summary is not None else "stopped"
    if trace.steps and (trace.summary is None or settings.delay > 0):
        timed = summary_from_steps(trace.steps, len(ids), cfg.template, reason)
        trace.summary = timed if trace.summary is None else dataclasses.replace(
            trace.summary, tokens_per_s=timed.tokens_per_s, decode_s=timed.decode_s)
        if settings.delay > 0:
            notes.append("Slow motion: tokens/s computed from the engine's step timings (pauses excluded).")
    if error is not None:
        notes.append(f"✗ Generation failed: {type(error).__name__}: {error}")
    if reason == "time limit":
        notes.append("⏱ Stopped at this instance's time limit per answer; the answer so far is kept.")
    elif reason == "stopped":
        notes.append("■ Stopped: the answer so far is kept.")


def cost_curve(s: Session, trace: Trace | None) -> CostCurve:
    """What a step of n tokens costs: from the meter's timings once it measured the trace (views.meter_curve: its
    own record, also for a trace loaded from a file), else this machine's measured t(n)/t(1) from the session's engine
    (the adaptive and hybrid trees time forwards of every size on their first answer, then refine it with every
    step), or why it cannot be shown."""
    live = engine_curve(s, trace)
    metered = meter_curve(trace.speed if trace is not None else None,
                          shape=live.ms if live.relative is not None and live.steady else None)
    return metered or live


def engine_curve(s: Session, trace: Trace | None) -> CostCurve:
    """This machine's measured t(n)/t(1) from the session's engine's cost-sized drafter, or why there is none."""
    engine = s.engine
    if engine is None:
        return CostCurve(None, "no model has answered in this tab yet")
    if trace is not None and trace.model and trace.model != label(s.model):
        return CostCurve(None, f"this trace was recorded with another model ({trace.model[:60]})")
    template = str((trace.settings if trace is not None else {}).get("template", ""))
    names = ("hybrid", "adaptive") if template.startswith("hybrid") else ("adaptive", "hybrid")
    for name in names:
        cost = getattr(getattr(engine, name, None), "cost", None)
        if cost is not None and getattr(cost, "measured", False) and cost(1) > 0:
            spread = float(getattr(cost, "spread", 0.0) or 0.0)
            return CostCurve(lambda n, c=cost: c(n) / c(1), source=f"the {name} tree on this machine",
                             steady=steady(cost), note="" if steady(cost) else f"its repeats spread ±{spread:.0%}",
                             ms=cost)
    return CostCurve(None, "only the adaptive and hybrid trees time forwards of every size (on their first answer, "
                           "in a few seconds); the static trees never do, so ask once with one of them")


def was_cut(trace: Trace) -> bool:
    """Whether the answer ended before its end: the visitor's Stop, or this instance's time limit."""
    return trace.summary is not None and trace.summary.stop_reason in ("stopped", "time limit")


def _final_view(s: Session, trace: Trace, settings: ChatSettings, notes: list[str], compared: bool) -> dict:
    """The view after an answer: its best step, the meter, the replay slider and the trace download."""
    view = {"chat": s.display, "status": done_status(notes, trace), "matrix": matrix_info(s.engine, s.k)}
    if not trace.steps:
        return view
    best = best_step(trace)
    view.update(step_views(trace, best, cost_curve(s, trace)))
    view["chat"] = marked_chat(s.display, trace, best, settings.colour)
    view["replay"] = replay_slider(trace, best + 1)
    view["meter"] = live_meter(trace) if compared else trace_meter(
        trace, note=STOPPED_HINT if settings.compare and was_cut(trace) else MEASURE_HINT)
    view["race"] = race_html(trace, wait=RACE_WAIT if compared else NOT_MEASURED if settings.compare else "")
    view["trace_file"] = str(trace.save(s.files() / "trace.json"))
    return view


def _measure(studio: Studio, s: Session, twin: Any, ids: list[int], cfg: DecodeConfig, trace: Trace,
             stop: threading.Event, settings: ChatSettings, notes: list[str]) -> Iterator[dict]:
    """Time Token Recycling and plain decoding in alternating chunks from the answer's starting state."""
    est = SpeedEstimate(None, None, None, None, None, 0, 0, False, "nothing was measured")
    answer_mean = trace.summary.mean_accepted  # shown by the meter, as by the chart beside it

    rounds = measure_rounds(studio, s, twin, ids, cfg, stop, sizes=answer_sizes(trace.steps))
    try:  # the slot is held while a round decodes, never while this generator waits for its visitor to pull
        while take_slot(stop.is_set):
            try:
                est, more = _rounds_until(rounds, est, time.monotonic() + RENDER_EVERY_S, stop)
            finally:
                DECODE_SLOT.release()
            if not more:
                break
            yield {"meter": measured_meter(est, done=False, answer_mean=answer_mean),
                   "status": measuring_status(est, trace.summary.new_tokens)}
    finally:
        rounds.close()
    if stop.is_set():
        est = dataclasses.replace(est, trusted=False, reason="the measurement was stopped")
    if est.identical is False:
        notes.append("⚠ Token Recycling and plain decoding produced different tokens.")
    trace.speed = dataclasses.asdict(est)
    note = measure_note(est, trace.summary.new_tokens, stopped=stop.is_set())
    view = {"meter": measured_meter(est, note=note, answer_mean=answer_mean, answer_tokens=trace.summary.new_tokens),
            "status": done_status(notes, trace),
            "race": race_html(trace), "trace_file": str(trace.save(s.files() / "trace.json")),
            # the cost panel's estimate follows the meter: withheld once it says "too noisy"
            "cost": cost_html(trace.steps[best_step(trace)], cost_curve(s, trace), trace)}
    yield view


def measure_rounds(studio: Studio, s: Session, twin: Any, ids: list[int], cfg: DecodeConfig,
                   stop: threading.Event, sizes: list[int] | None = None) -> Iterator[SpeedEstimate]:
    """The interleaved measurement's estimates (tr_core.bench.meter.interleave), each pass from a copy of the answer's
    starting state `twin`, drafting the answer's tree `sizes` again; on ZeroGPU they come from a GPU call."""
    max_s, chunk_ms = studio.config.measure_max_s, studio.config.measure_chunk_ms
    if zerogpu.installed():
        return zerogpu.measure_rounds(twin, s.model, ids, cfg, max_s, chunk_ms, sizes)

    def runs() -> tuple[Iterator, Iterator]:
        engine = forked(twin, sizes)
        plain = cfg.with_(plain=True)
        return engine.generate(ids, cfg, stop=stop.is_set), engine.generate(ids, plain, stop=stop.is_set)

    return interleave(*runs(), max_s=max_s, chunk_ms=chunk_ms, should_stop=stop.is_set, again=runs)


def _rounds_until(rounds: Iterator[SpeedEstimate], est: SpeedEstimate, until: float,
                  stop: threading.Event) -> tuple[SpeedEstimate, bool]:
    """Pull estimates until the monotonic time `until` (the next redraw): (the last estimate, whether more may come)."""
    for est in rounds:
        if time.monotonic() >= until or stop.is_set():
            return est, not stop.is_set()
    return est, False


def measuring_status(est: SpeedEstimate, answer_tokens: int) -> str:
    """The status line while the speedup is being measured."""
    if est.passes > 1:
        return f"Measuring the speedup again (pass {est.passes} of at most {MAX_PASSES}: too noisy so far)…"
    return f"Measuring the speedup… {est.covered} / {answer_tokens} tokens"


def measure_note(est: SpeedEstimate, answer_tokens: int, stopped: bool = False) -> str:
    """What the measurement did not cover: tokens past the time cap (or the visitor's Stop), pairs left out as
    disturbed."""
    parts = []
    if est.covered < answer_tokens:
        why = "stopped" if stopped else "time cap"
        parts.append(coverage_note(est.covered, answer_tokens, why))
    parts.append(left_out_note(est.left_out))
    return "; ".join(p for p in parts if p)


# ------------------------------------------------------------------------------------- small handlers


def stop_answer(s: Session) -> dict:
    """Ask the running answer (or measurement) to stop after its current step; the answer so far is kept.

    While something runs, the status is left to it: it says "■ Stopped" within a step, and a reply from here
    could arrive after that and claim it is still stopping."""
    stop = s.answer_stop
    if stop is None:
        return {"status": "Nothing is running."}
    stop.set()
    return {}


def new_chat(s: Session) -> dict:
    """Start a clean conversation (the matrix keeps what it learned); a running answer is stopped and dropped."""
    with s.lock:
        s.conversation += 1
        running = s.answer_stop
        if running is not None:
            running.set()
        s.history, s.display, s.trace = [], [], None
    note = " The answer that was running was stopped." if running is not None else ""
    return {**blank_views(), "chat": [], "status": f"New conversation (the matrix keeps what it learned).{note}"}


def replay(s: Session, step: Any, colour: bool) -> dict:
    """Show any recorded step of the last answer: tree, matrix window, chart and the text up to that step."""
    trace = s.trace
    if trace is None or not trace.steps:
        return {"status": "Nothing to replay yet: send a message or load a trace."}
    try:
        i = int(float(step or 1)) - 1
    except (TypeError, ValueError, OverflowError):
        i = 0
    i = max(0, min(i, len(trace.steps) - 1))
    view = step_views(trace, i, cost_curve(s, trace))
    view.update({"chat": marked_chat(s.display, trace, i, colour, upto=i),
                 "status": f"Replaying step {i + 1} of {len(trace.steps)}"})
    return view


def export_replay(s: Session) -> dict:
    """Write the last answer (or loaded trace) as one self-contained HTML replay in the session's folder."""
    from present.replay import replay_html

    trace = s.trace
    if trace is None or not trace.steps:
        return {"status": "No answer to export yet: send a message or load a trace first.", "replay_html": None}
    path = s.files() / "replay.html"
    path.write_text(replay_html(trace), encoding="utf-8")
    size = path.stat().st_size / 1e6
    return {"replay_html": str(path), "status": f"✓ Replay of {len(trace.steps)} steps saved as replay.html "
                                                f"({size:.1f} MB): one file that works offline in any browser."}


def step_by(s: Session, step: Any, delta: int) -> int:
    """The replay slider's value after a previous/next click."""
    n = len(s.trace.steps) if s.trace else 1
    try:
        current = int(float(step or 1))
    except (TypeError, ValueError, OverflowError):
        current = 1
    return max(1, min(current + delta, n))


def load_trace(studio: Studio, s: Session, path: str | None) -> dict:
    """Load a recorded trace (JSON) and show it; needs no model. A bad file leaves the session as it was."""
    if not path:
        return {"status": "No file."}
    if s.answering:
        return {"status": f"✗ {BUSY}"}
    try:
        trace = Trace.load(path, max_bytes=int(studio.config.max_upload_mb * 1024 * 1024))
    except TraceError as exc:
        return {"status": f"✗ This trace cannot be loaded: {exc}"}
    if not trace.steps:
        return {"status": "✗ This trace cannot be loaded: it has no steps."}
    display = [message(m["role"], m["content"]) for m in trace.messages]
    display.append({"role": "assistant", "content": coloured_answer(trace)})
    with s.lock:
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        s.trace, s.display, s.history = trace, display, []
        s.conversation += 1
    best = best_step(trace)
    view = step_views(trace, best, cost_curve(s, trace))
    view.update({"chat": marked_chat(display, trace, best, True), "meter": trace_meter(trace, loaded=True),
                 "race": race_html(trace),
                 "replay": replay_slider(trace, best + 1),
                 "status": f"Loaded a trace of {len(trace.steps)} steps recorded with "
                           f"{trace.model[:80] or 'an unknown model'} (shown as a new conversation; the matrix is "
                           "unchanged). Use the replay slider."})
    return view


def load_model(studio: Studio, s: Session, name: Any) -> dict:
    """Switch this session to another model (its matrix warm-started); refused names all get the same answer in
    public mode."""
    try:
        key = studio.catalog.allowed(clean_text(name, "model name", 500))
    except (ModelRefused, InputError) as exc:
        return {"status": f"✗ {REFUSED if studio.config.public else exc}"}
    if s.answering:
        return {"status": f"✗ {BUSY}"}
    try:
        engine = new_engine(studio, key, s.k)  # no session lock held: other tabs go on meanwhile
    except Exception as exc:  # noqa: BLE001
        shown = "That model could not be loaded right now." if studio.config.public else f"Could not load {key!r}: {exc}"
        return {"status": f"✗ {shown}  \nStill using {label(s.model)}."}
    with s.lock:
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        adopt_engine(s, engine, [], "")
        s.model, s.history, s.display, s.trace = key, [], [], None
        s.conversation += 1
        warm, info = s.warm_note, matrix_info(s.engine, s.k)
    return {"status": f"✓ Loaded {label(key)}; new conversation. {warm.rstrip('.')}.", "chat": [],
            "race": race_html(None), "matrix": info, "warm": warm}


def reset_matrix(s: Session) -> dict:
    """Return the session's matrix (and the hybrid tree's context index) to its warm start, forgetting what this
    tab's answers taught; refused while an answer runs. See `empty_matrix` for a matrix with nothing in it."""
    with s.lock:  # no answer can start (or be running) while the matrix changes
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        if s.engine is not None:
            s.engine.forget()
            if s.warm_state is not None:
                _restore_keeping_costs(s.engine, s.warm_state)
        info = matrix_info(s.engine, s.k)
        warm = s.warm_state is not None
    status = ("Adjacency matrix returned to its warm start (what this tab's answers taught is forgotten); context "
              "index cleared." if warm else
              "Adjacency matrix and context index cleared (this model has no warm start).")
    return {"status": status, "matrix": info, "warm": s.warm_note if warm else NO_WARM}


def _restore_keeping_costs(engine: Any, state: dict) -> None:
    """Return `engine` to a snapshot, keeping the forward costs timed since (they describe the machine, not the
    answers, and timing them again costs seconds)."""
    costs = {name: getattr(getattr(engine, name, None), "cost", None) for name in ("adaptive", "hybrid")}
    engine.restore(state)
    for name, cost in costs.items():
        if cost is not None and getattr(cost, "measured", False):
            getattr(engine, name).cost = cost


def empty_matrix(s: Session) -> dict:
    """Empty the session's matrix entirely (no warm start either), e.g. to show it learning from nothing."""
    with s.lock:
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        if s.engine is not None:
            s.engine.forget()
        info = matrix_info(s.engine, s.k)
    return {"status": "Adjacency matrix emptied (no warm start) and context index cleared: it learns from nothing "
                      "from the next answer on.", "matrix": info, "warm": "The matrix was emptied on request."}


def save_matrix(s: Session) -> dict:
    """Write the session's matrix to its folder and offer it for download: a copy taken under the session lock
    (no answer changes it meanwhile), written outside it."""
    with s.lock:
        if s.engine is None:
            return {"status": "No matrix yet: send a message first."}
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        matrix = s.engine.matrix.clone()
    path = s.files() / "adjacency_matrix.pt"
    matrix.save(path)
    return {"matrix_file": str(path), "status": f"Matrix saved ({matrix.rows_filled:,} rows filled)."}


def load_matrix(studio: Studio, s: Session, path: str | None, k: Any) -> dict:
    """Load an uploaded matrix into the session's engine; a bad file changes nothing."""
    if not path:
        return {"status": "No file."}
    if s.answering:
        return {"status": f"✗ {BUSY}"}
    notes: list[str] = []
    try:
        engine = engine_for(studio, s, clamp("k", k, notes, int))
    except Exception as exc:  # noqa: BLE001 - the model could not be loaded
        return {"status": _error_text(studio, exc), "matrix": matrix_info(s.engine, s.k)}
    try:  # read into a copy: the session's engine and matrix change only once the file is good, under its lock
        loaded = engine.matrix.clone()
        loaded.load(path)
    except Exception as exc:  # noqa: BLE001 - ValueError says what is wrong with the file; anything else is unreadable
        text = str(exc).replace(str(path), "the file") if isinstance(exc, ValueError) else "the file cannot be read"
        return {"status": f"✗ Could not load the matrix: {text}", "matrix": matrix_info(s.engine, s.k)}
    with s.lock:
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        engine.matrix.copy_from(loaded)
        adopt_engine(s, engine, notes, f"Candidates per row changed to k = {engine.matrix.k}.")
        info = matrix_info(s.engine, s.k)
    return {"status": "  \n".join(notes + ["Matrix loaded (Reset returns to this model's warm start)."]),
            "matrix": info}
