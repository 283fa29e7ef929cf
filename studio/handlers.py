"""The studio's handlers: plain functions of (studio, session, inputs) that return views (dicts keyed by views.KEYS).

Here: each session's engine (made warm, replaced when k or the model changes), answering a chat message, and the
model and matrix handlers. Beside it: settings.py (a request's settings, validated), answer.py (the live views of
an answer), measure.py (the speed meter's measurement), costs.py (this machine's forward costs) and traces.py
(replay, trace files, the HTML export).

No Gradio here: the page (page.py) turns views into component updates, and tests call these directly.
Everything a visitor sends is validated before the session changes; every decode holds DECODE_SLOT and
belongs to the request that started it (closing the generator stops it within one step).
"""
from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from tr_core.config import DecodeConfig, DecodeConfigError
from tr_core.machine import speed_label
from tr_core.trace import Trace

from . import zerogpu
from .answer import ANSWERING, dropped_view, final_view, finish_trace, stream_answer, was_cut
from .costs import cost_curve, share_costs
from .decode_loop import crowd  # noqa: F401 - tests/test_speed.py names cost_curve from here
from .measure import measure_note, measure_speed, measuring_status  # noqa: F401 - and the notes (test_speed.py)
from .models import REFUSED, ModelRefused, canonical, label
from .session import BUSY, InputError, Session, SlotAbandoned, Studio, clean_text, decode_slot
from .settings import ChatSettings, clamp, parse_settings, trim_to_context  # noqa: F401 - and parse_settings
from .side_by_side import PAPER  # the paper's static 80-node tree, the comparison's first card
from .views import RENDER_EVERY_S, blank_views, coloured_answer, matrix_info, message, race_html

# ------------------------------------------------------------------------------------- the session's engine

NO_WARM = "The matrix starts empty (nothing was learned beforehand for this model)."
_WARM_STARTS: "weakref.WeakKeyDictionary[Any, WarmStart]" = weakref.WeakKeyDictionary()


class WarmStart(NamedTuple):
    """An engine's warm start: its state right after it (for Reset; None when nothing was loaded), a plain-English
    line for the page, and whether later sessions may fork it (complete, not being learned further)."""

    state: dict | None
    note: str
    reusable: bool = False


def warm_up(engine: Any, model_name: str, learn: bool,
            progress: Callable[[int, int], None] | None = None) -> WarmStart:
    """Start `engine`'s matrix warm (tr_core.warm: the embedded model's shipped start, else one learned from the
    project's own questions and cached; never from visitors).

    Called holding the decode slot (new_engine). A warm start learned here takes about FIRST_ANSWER_BUDGET_S at
    most (a partial one when time runs out) and lends the slot between its steps, so other visitors' answers go on
    meanwhile; after a partial one, the full one is learned in the background, only while no visitor decodes, and
    cached for the next sessions (this one keeps its engine)."""
    from tr_core.engine import Engine
    from tr_core.warm import FIRST_ANSWER_BUDGET_S, WarmStartError, learn_in_background, warm_start

    from .decode_loop import HANDOFF_S
    from .session import DECODE_SLOT, take_slot

    def lend(polite: bool = False) -> None:  # the slot this thread holds, to whoever waits for it; then back
        DECODE_SLOT.release()
        time.sleep(HANDOFF_S)
        while polite and crowd() > 0:  # the background learn waits for every visitor's answer to end
            time.sleep(RENDER_EVERY_S)
        take_slot()

    try:
        info = warm_start(engine, model_name, learn=learn, progress=progress, budget_s=FIRST_ANSWER_BUDGET_S,
                          between=lend)
    except WarmStartError as exc:  # a shipped file that does not fit this model: the session still works, cold
        return WarmStart(None, f"Cold start: the matrix starts empty (the file it learned beforehand cannot be used: {exc})")
    if info.source == "none":
        return WarmStart(None, info.describe() or NO_WARM, reusable=True)
    if info.partial and learn:
        model, tokenizer, k = engine.model, engine.tokenizer, engine.matrix.k
        learn_in_background(lambda: Engine(model, tokenizer, topk_candidates=k), model_name, hold=decode_slot,
                            between=lambda: lend(polite=True))
    return WarmStart(engine.snapshot(), info.describe(), reusable=not info.partial)


def new_engine(studio: Studio, model_name: str, k: int, should_stop: Callable[[], bool] | None = None,
               progress: Callable[[int, int], None] | None = None) -> Any:
    """A new engine for a model, warm-started. The model load waits on no one (it may wait on the network, and
    other tabs' decoding must not wait on it). The first engine of a model and k is built and warm-started holding
    the decode slot (a warm start being learned lends it between its steps: warm_up); later ones are forks of a
    copy of it, made without the slot, so a class arriving at once does not queue for it between batch steps."""
    from tr_core.engine import Engine

    model, tokenizer = studio.catalog.get(model_name)
    twin = warm_twin(studio, model_name, model, k)
    if twin is not None:
        return twin
    with decode_slot(should_stop):
        engine = Engine(model, tokenizer, topk_candidates=k)
        # on ZeroGPU the app's copy is on the CPU: a warm start is only loaded there, never learned
        warm = _WARM_STARTS[engine] = warm_up(engine, model_name, learn=not zerogpu.on_zerogpu(), progress=progress)
    if warm.reusable:
        with _TEMPLATES_LOCK:
            _TEMPLATES[(canonical(model_name), k)] = (engine.fork(), warm)
    return engine


# (model name, k) -> a warm-started engine that never decodes, and its warm start: new sessions fork it
_TEMPLATES: dict[tuple[str, int], tuple[Any, WarmStart]] = {}
_TEMPLATES_LOCK = threading.Lock()


def warm_twin(studio: Studio, model_name: str, model: Any, k: int) -> Any:
    """A fork of the model's warm-started template engine for k, or None when it has none yet; templates of models
    no longer loaded (or loaded again since) are dropped, so they hold no model in memory."""
    name = canonical(model_name)
    with _TEMPLATES_LOCK:
        for key, (held, _) in list(_TEMPLATES.items()):
            stale = held.model is not model if key[0] == name else not studio.catalog.is_loaded(key[0])
            if stale:
                del _TEMPLATES[key]
        template, warm = _TEMPLATES.get((name, k), (None, None))
    if template is None:
        return None
    twin = template.fork()
    _WARM_STARTS[twin] = warm
    return twin


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
        warm = _WARM_STARTS.get(engine, WarmStart(None, NO_WARM))
        s.warm_state, s.warm_note = warm.state, warm.note


def ensure_engine(studio: Studio, s: Session, k: int, notes: list[str],
                  should_stop: Callable[[], bool] | None = None) -> Any:
    """The session's engine, created on first use or when k changed (a new k needs a new matrix)."""
    engine = engine_for(studio, s, k, should_stop)
    adopt_engine(s, engine, notes, f"Candidates per row changed to k = {k}: the adjacency matrix starts again "
                                   "from what it learned beforehand.")
    return engine


# ------------------------------------------------------------------------------------------------ chat


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
                       template=settings.template, provenance=True)  # the microscope shows each step's rows
    return engine, ids, messages, cfg


PRELOAD_WAIT_S = 300.0  # an answer waits this long at most for the preload before it loads the model itself
WARMING = "Learning from answers to the project's sample questions for this model (once; then cached): {} of {}…"


def with_first(views: Iterator[dict], extra: dict) -> Iterator[dict]:
    """`views` with `extra` shown in its first view, or alone where there is none; returns what `views` returns."""
    try:
        view = next(views)
    except StopIteration as end:
        if extra:
            yield extra
        return end.value
    yield extra | view
    return (yield from views)


def _set_up(studio: Studio, s: Session, k: int, notes: list[str], stop: threading.Event) -> Iterator[dict]:
    """Wait for the preload (at most PRELOAD_WAIT_S), then create the session's engine when it has none for k,
    yielding what the preload does and the warm start's progress while one is learned (once per model and machine).
    Returns the warm-start note and matrix line to show (with the answer's first view: in a crowd, every update
    an answer waits for before it joins the batch delays its first words)."""
    waited_until = time.monotonic() + PRELOAD_WAIT_S
    while not studio.warm.wait(RENDER_EVERY_S) and time.monotonic() < waited_until and not stop.is_set():
        if studio.preparing:
            yield {"status": studio.preparing}
    if s.engine is not None and k == s.k:
        return {}
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
                                          "again from what it learned beforehand.")
    return {"warm": s.warm_note, "matrix": matrix_info(s.engine, s.k)}


# the decode slot may be held by the app's start-up, another visitor's answer or speed measurement, or this tab's own
SLOT_ABANDONED = ("■ Stopped before decoding began: the model was still busy (starting up, or with another answer or "
                  "speed measurement); nothing was changed.")


def precision(engine: Any) -> dict[str, Any]:
    """The dtype an engine computes in, whether it runs in exact mode (tr_core/invariant.py) and the machine its
    speeds are timed on, for the trace (the page names it beside every speed figure)."""
    dtype = getattr(engine, "dtype", None)
    where = zerogpu.LABEL if zerogpu.installed() else speed_label(getattr(engine, "device", None))
    return {"dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "exact": getattr(engine, "exact", None), "machine": where}


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
        shown_later = yield from _set_up(studio, s, settings.k, notes, stop)
        engine, ids, messages, cfg = _prepare(studio, s, text, settings, notes)
        share_costs(studio, s.model, engine, before_answer=True)  # any engine, model or tree: the costs timed here
        probing = engine.times_forwards_first(cfg)
    except Exception as exc:  # noqa: BLE001 - model load / settings errors are shown, the session goes on
        yield {"chat": s.display, "msg": text, "status": _error_text(studio, exc), "matrix": matrix_info(s.engine, s.k)}
        return
    if probing:
        yield {"status": PROBING}
    start = engine.fork()  # the state this answer starts from: for the measurement, and later the side-by-side
    trace = Trace(model=label(s.model), messages=messages, settings=dict(dataclasses.asdict(cfg), k=settings.k,
                                                                         **precision(engine)))
    try:
        error = yield from with_first(stream_answer(studio, s, engine, ids, cfg, trace, settings, stop, conversation,
                                                    pending, notes), shown_later)
    finally:  # a probe this answer ran serves every later engine, even when the visitor left mid-answer
        share_costs(studio, s.model, engine)
    finish_trace(trace, engine, ids, cfg, settings, error, notes)
    stopped = was_cut(trace)
    with s.lock:
        current = s.conversation == conversation
        if current and trace.steps:
            s.history = messages + [{"role": "assistant", "content": trace.answer}]
            s.display = pending[:-1] + [{"role": "assistant", "content": coloured_answer(trace, colour=settings.colour)}]
            s.trace, s.last_start = trace, (start, ids, cfg)
        elif current:  # nothing generated: keep the message out of the conversation the model sees
            s.display = pending[:-2]
    if not current:
        yield dropped_view(s)
        return
    crowded = bool(settings.compare) and crowd() > 0  # a measurement would slow the others, and be unfair to both
    measure = settings.compare and trace.steps and error is None and not stopped and not crowded
    final = final_view(s, trace, settings, notes, compared=bool(measure), crowded=crowded)
    if measure:
        final["status"] = "  \n".join(notes + ["Measuring the speedup: both methods in turns on the same tokens…"])
        yield final
        for view in measure_speed(studio, s, start, ids, cfg, trace, stop, settings, notes):
            if s.conversation != conversation:  # New chat while measuring: the answer is gone from the page
                yield dropped_view(s)
                return
            yield view
    else:
        yield final


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
        s.history, s.display, s.trace, s.last_start = [], [], None, None
    note = " The answer that was running was stopped." if running is not None else ""
    return {**blank_views(), "chat": [], "status": f"New conversation (the matrix keeps what it learned).{note}"}


# ------------------------------------------------------------------------------------ the model and its matrix


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
        s.model, s.history, s.display, s.trace, s.last_start = key, [], [], None, None
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
    status = ("Adjacency matrix returned to what it learned beforehand (what this tab's answers taught is forgotten); context "
              "index cleared." if warm else
              "Adjacency matrix and context index cleared (nothing was learned beforehand for this model).")
    return {"status": status, "matrix": info, "warm": s.warm_note if warm else NO_WARM}


def _restore_keeping_costs(engine: Any, state: dict) -> None:
    """Return `engine` to a snapshot, keeping the forward costs timed since (they describe the machine, not the
    answers, and timing them again costs seconds)."""
    engine.restore(state, keep_costs=True)


def empty_matrix(s: Session) -> dict:
    """Empty the session's matrix entirely (no warm start either), e.g. to show it learning from nothing."""
    with s.lock:
        if s.answering:
            return {"status": f"✗ {BUSY}"}
        if s.engine is not None:
            s.engine.forget()
        info = matrix_info(s.engine, s.k)
    return {"status": "Adjacency matrix emptied (nothing learned beforehand either) and context index cleared: it learns from nothing "
                      "from the next answer on.", "matrix": info, "warm": "The matrix was emptied on request."}


def paper_mode(studio: Studio, s: Session, k: int) -> dict:
    """The paper's setting in one click: its 80-node tree, drafting from the matrix alone, and the matrix emptied
    (nothing learned beforehand), so that it learns from this conversation only, as in the paper."""
    if s.answering:
        return {"status": f"✗ {BUSY}"}
    notes: list[str] = []
    try:  # a fresh tab has no matrix yet: make it, then empty it
        ensure_engine(studio, s, clamp("k", k, notes, int), notes)
    except Exception as exc:  # noqa: BLE001 - the model could not be loaded
        return {"status": _error_text(studio, exc), "matrix": matrix_info(s.engine, s.k)}
    view = empty_matrix(s)
    if view["status"].startswith("✗"):
        return view
    return {**view, "drafting": PAPER, "template": PAPER, "warm": "Paper mode emptied the matrix.",
            "status": "✓ Paper mode: the paper's 80-node tree, drafting from the matrix alone, and an empty matrix "
                      "that learns from your next answers, as in the paper."}


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
    return {"status": "  \n".join(notes + ["Matrix loaded (Reset returns to what this model learned beforehand)."]),
            "matrix": info}
