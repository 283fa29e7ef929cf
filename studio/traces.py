"""A recorded answer, after the fact: replay any of its steps, load a trace file, export a self-contained HTML
replay. None of these needs a model."""
from __future__ import annotations

from typing import Any

from tr_core.trace import Trace, TraceError

from .costs import cost_curve
from .session import BUSY, Session, Studio
from .views import best_step, coloured_answer, marked_chat, message, race_html, replay_slider, step_views, trace_meter


def replay(s: Session, step: Any, colour: bool) -> dict:
    """Show any recorded step of the last answer: tree, matrix window, chart and the text up to that step."""
    trace = s.trace
    if trace is None or not trace.steps:
        return {"status": "Nothing to replay yet: send a message or load a trace."}
    i = slider_step(step, len(trace.steps))
    view = step_views(trace, i, cost_curve(s, trace))
    view.update({"chat": marked_chat(s.display, trace, i, colour, upto=i),
                 "status": f"Replaying step {i + 1} of {len(trace.steps)}"})
    return view


def tour(s: Session, step: Any) -> dict:
    """The guided tour of the step shown on the replay slider (after an answer: the telling step, best_step)."""
    from present.tour import tour_html

    trace = s.trace
    if trace is None or not trace.steps:
        return {"status": "No answer to tour yet: send a message or load a trace.", "tour": ""}
    i = slider_step(step, len(trace.steps))
    # said as done, not as an instruction: the tour covers this line while open, and after it closes the line stays
    # (a reader found "→ or space for the next screen" under the microscope)
    return {"tour": tour_html(trace, i), "status": f"Toured step {i + 1} of {len(trace.steps)} (in the tour, → or "
                                                   "space for the next screen, Esc to close)."}


def slider_step(step: Any, n: int) -> int:
    """The 0-based step a replay slider's value names, within a trace of n steps."""
    try:
        i = int(float(step or 1)) - 1
    except (TypeError, ValueError, OverflowError):
        i = 0
    return max(0, min(i, n - 1))


def step_by(s: Session, step: Any, delta: int) -> int:
    """The replay slider's value after a previous/next click."""
    n = len(s.trace.steps) if s.trace else 1
    try:
        current = int(float(step or 1))
    except (TypeError, ValueError, OverflowError):
        current = 1
    return max(1, min(current + delta, n))


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
        s.trace, s.display, s.history, s.last_start = trace, display, [], None
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
