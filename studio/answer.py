"""One answer as it is written: the live views while the engine decodes (`stream_answer`), the trace's last touches
(`finish_trace`) and the view once it has ended (`final_view`)."""
from __future__ import annotations

import dataclasses
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from present.chart import accepted_chart_explained
from present.heatmap import MatrixTracker, heatmap_figure
from present.tree import tree_figure
from tr_core.config import DecodeConfig
from tr_core.engine import Engine
from tr_core.events import StepEvent, SummaryEvent
from tr_core.trace import Trace

from . import zerogpu
from .costs import cost_curve
from .decode_loop import ROWS, BatchedEngine, crowd, newcomers
from .recording import record_live
from .session import PausingEngine, Session, Studio
from .settings import ChatSettings
from .views import (MEASURE_HINT, RACE_WAIT, RENDER_EVERY_S, STOPPED_HINT, best_step, blank_views, coloured_answer,
                    cost_html, decoding_html, done_status, live_meter, marked_chat, matrix_info, microscope_html,
                    race_html, replay_slider, step_story_view, step_views, trace_meter)

ANSWERING = "the answer is still being written"  # the race panel while an answer runs
CROWD_HINT = ("other visitors' answers were being written meanwhile, so the speedup was not measured: timing both "
              "methods now would slow their answers, and a shared machine's timings would favour neither fairly")
DRAWS_PER_S = 8.0  # redraws a second of all answers' figures together, in a crowd (redraw_every)
NOT_MEASURED = "this answer ended early (stopped, or failed), so it was not measured against plain decoding"


def summary_from_steps(steps: list[StepEvent], prompt_tokens: int, template: str, reason: str) -> SummaryEvent:
    """A summary from step timings alone (an answer stopped before the engine's summary, or slowed by pauses)."""
    tokens = [t for e in steps for t in e.emitted]
    decode_s = sum(e.timings.get("total", 0.0) for e in steps) / 1000.0
    return SummaryEvent(tokens=tokens, prompt_tokens=prompt_tokens, new_tokens=len(tokens), steps=len(steps),
                        mean_accepted=len(tokens) / max(len(steps), 1),
                        tokens_per_s=len(tokens) / decode_s if decode_s else 0.0, prefill_s=0.0, decode_s=decode_s,
                        wall_s=decode_s, stop_reason=reason, method="recycling", template=template,
                        matrix_rows_filled=0, matrix_mb=0.0)


def stream_answer(studio: Studio, s: Session, engine: Any, ids: list[int], cfg: DecodeConfig, trace: Trace,
                  settings: ChatSettings, stop: threading.Event, conversation: int, pending: list[dict],
                  notes: list[str]) -> Iterator[dict]:
    """Decode the answer in the engine thread, yielding live views; returns the engine's error, if any."""
    text_of = trace.cached_text(engine.token_text)
    tracker = MatrixTracker()
    curve = cost_curve(s, None)
    note_md = "  \n".join(notes)
    decoder = answer_engine(studio, s, engine, settings)
    live = record_live(decoder, ids, cfg, trace, stop, redraw_every, settings.delay,
                       time_limit_s=studio.config.time_limit_s, ticks=True)
    try:
        for new_steps in live:
            if s.conversation != conversation:  # New chat: stop this answer (closing record_live stops the engine)
                break
            if not new_steps:  # still waiting for a row of the shared batch
                yield {"status": waiting_status(decoder, note_md)}
                continue
            for ev in new_steps:
                before = tracker.update(ev)  # the last step's story compares its rows with these
            last = trace.steps[-1]
            shown = coloured_answer(trace, colour=settings.colour)
            view = {"chat": pending[:-1] + [{"role": "assistant", "content": shown + " ▌"}],
                    "status": note_md or f"Step {last.step + 1} · {sum(len(e.emitted) for e in trace.steps)} tokens"}
            if draws_figures(trace, new_steps, settings):
                view |= live_figures(trace, last, text_of, tracker, before, curve, settings)
            yield view
    except Exception as exc:  # noqa: BLE001 - shown in the page; the session goes on
        traceback.print_exception(exc)
        return exc
    finally:
        live.close()  # the decode belongs to this request: stop the engine thread and join it
    return None


def draws_figures(trace: Trace, new_steps: list[StepEvent], settings: ChatSettings) -> bool:
    """Whether this update of a live answer redraws its figures. Alone, or in slow motion, always. In a crowd
    the first words go first: an answer's first update is its text alone, and nobody's figures are drawn while
    other answers still wait for their first token (drawing would take the cores their prefill needs)."""
    if settings.delay > 0 or crowd() <= 1:
        return True
    return len(trace.steps) > len(new_steps) and newcomers() == 0


def live_figures(trace: Trace, last: StepEvent, text_of: Any, tracker: MatrixTracker, before: Any, curve: Any,
                 settings: ChatSettings) -> dict:
    """The live figures of an answer's latest step: tree, matrix window, story, cost, microscope, chart, meter."""
    return {"tree": tree_figure(last, text_of), "heat": heatmap_figure(tracker, last, text_of),
            "story": step_story_view(last, text_of, before), "cost": cost_html(last, curve, trace),
            "microscope": microscope_html(trace, last.step), "decoding": decoding_html(trace.settings),
            "chart": accepted_chart_explained(trace.steps), "meter": live_meter(trace, settings.compare)}


def answer_engine(studio: Studio, s: Session, engine: Any, settings: ChatSettings) -> Any:
    """What decodes this answer: the model's shared batch with every other visitor's answers (decode_loop.py); on
    ZeroGPU a GPU call of its own, and in slow motion the engine alone, holding the slot step by step (its pauses
    leave the slot to others)."""
    if zerogpu.installed():
        return zerogpu.RemoteEngine(engine, s.model, studio.config.time_limit_s)
    if settings.delay > 0 or not isinstance(engine, Engine):  # (a stand-in engine of the tests decodes alone)
        return PausingEngine(engine, pause=settings.delay > 0)
    return BatchedEngine(engine)


def redraw_every() -> float:
    """Seconds between redraws of an answer's figures: RENDER_EVERY_S, longer in a crowd, so that all visitors'
    figures together are drawn at most about DRAWS_PER_S times a second on the cores that decode."""
    return max(RENDER_EVERY_S, crowd() / DRAWS_PER_S)


def waiting_status(decoder: Any, notes: str) -> str:
    """The status line of an answer before its first step: its place in line for the shared batch, else its notes
    (e.g. that this machine's forwards are being timed)."""
    place = decoder.place() if isinstance(decoder, BatchedEngine) else 0
    if place <= 0:
        return notes or "Starting…"
    return f"In line for the shared batch: place {place} ({ROWS} answers are written at once)…"


def finish_trace(trace: Trace, engine: Any, ids: list[int], cfg: DecodeConfig, settings: ChatSettings,
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


def was_cut(trace: Trace) -> bool:
    """Whether the answer ended before its end: the visitor's Stop, or this instance's time limit."""
    return trace.summary is not None and trace.summary.stop_reason in ("stopped", "time limit")


def final_view(s: Session, trace: Trace, settings: ChatSettings, notes: list[str], compared: bool,
               crowded: bool = False) -> dict:
    """The view after an answer: its best step, the meter, the replay slider and the trace download (`crowded`:
    not measured because other visitors' answers were being written)."""
    view = {"chat": s.display, "status": done_status(notes, trace), "matrix": matrix_info(s.engine, s.k)}
    if not trace.steps:
        return view
    best = best_step(trace)
    view.update(step_views(trace, best, cost_curve(s, trace)))
    view["chat"] = marked_chat(s.display, trace, best, settings.colour)
    view["replay"] = replay_slider(trace, best + 1)
    view["meter"] = live_meter(trace) if compared else trace_meter(trace, note=meter_hint(trace, settings, crowded))
    view["race"] = race_html(trace, wait=RACE_WAIT if compared else NOT_MEASURED if settings.compare else "")
    view["trace_file"] = str(trace.save(s.files() / "trace.json"))
    return view


def meter_hint(trace: Trace, settings: ChatSettings, crowded: bool) -> str:
    """Why the meter shows no measured speedup for this answer."""
    if crowded:
        return CROWD_HINT
    return STOPPED_HINT if settings.compare and was_cut(trace) else MEASURE_HINT


def dropped_view(s: Session) -> dict:
    """After New chat was pressed while this answer (or its measurement) ran."""
    return {**blank_views(), "chat": s.display,
            "status": "New conversation (the answer that was running was stopped and dropped)."}
