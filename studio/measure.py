"""The speed meter's measurement after an answer: Token Recycling and plain decoding timed in alternating chunks
from the answer's starting state (meter.interleave), streamed to the meter as it goes."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

from tr_core.config import DecodeConfig
from tr_core.divergence import explain_at
from tr_core.engine import Engine
from tr_core.trace import Trace

from . import zerogpu
from .costs import cost_curve
from .decode_loop import crowd
from .meter import MAX_PASSES, SpeedEstimate, answer_sizes, interleave
from .session import DECODE_SLOT, Session, Studio, take_slot
from .settings import ChatSettings
from .views import (RENDER_EVERY_S, best_step, cost_html, coverage_note, done_status, left_out_note, measured_meter,
                    race_html)


CROWD_STOP = "other visitors' answers started, so the measurement stopped to leave them the machine"


def measure_speed(studio: Studio, s: Session, twin: Any, ids: list[int], cfg: DecodeConfig, trace: Trace,
                  stop: threading.Event, settings: ChatSettings, notes: list[str]) -> Iterator[dict]:
    """Time Token Recycling and plain decoding in alternating chunks from the answer's starting state."""
    est = SpeedEstimate(None, None, None, None, None, 0, 0, False, "nothing was measured")
    answer_mean = trace.summary.mean_accepted  # shown by the meter, as by the chart beside it

    rounds = measure_rounds(studio, s, twin, ids, cfg, stop, sizes=answer_sizes(trace.steps))
    crowded, slot = False, not zerogpu.installed()  # on ZeroGPU each measurement is a GPU call of its own
    try:  # the slot is held while a round decodes, never while this generator waits for its visitor to pull
        while not (crowded := crowd() > 0) and (not slot or take_slot(stop.is_set)):
            try:
                est, more = _rounds_until(rounds, est, time.monotonic() + RENDER_EVERY_S, stop)
            finally:
                if slot:
                    DECODE_SLOT.release()
            if not more:
                break
            yield {"meter": measured_meter(est, done=False, answer_mean=answer_mean, trace=trace),
                   "status": measuring_status(est, trace.summary.new_tokens)}
    finally:
        rounds.close()
    if stop.is_set():
        est = dataclasses.replace(est, trusted=False, reason="the measurement was stopped")
    elif crowded:
        est = dataclasses.replace(est, trusted=False, reason=CROWD_STOP)
    est = explained(est, twin, ids, trace)
    if est.identical is False and est.exact:
        notes.append("⚠ Token Recycling and plain decoding produced different tokens in exact mode.")
    trace.speed = dataclasses.asdict(est)
    note = measure_note(est, trace.summary.new_tokens, stopped=stop.is_set())
    view = {"meter": measured_meter(est, note=note, answer_mean=answer_mean, answer_tokens=trace.summary.new_tokens,
                                    trace=trace),
            "status": done_status(notes, trace),
            "race": race_html(trace), "trace_file": str(trace.save(s.files() / "trace.json")),
            # the cost panel's estimate follows the meter: withheld once it says "too noisy"
            "cost": cost_html(trace.steps[best_step(trace)], cost_curve(s, trace), trace)}
    yield view


def explained(est: SpeedEstimate, twin: Any, ids: list[int], trace: Trace) -> SpeedEstimate:
    """`est` with whether Token Recycling ran in exact mode and, where the two runs parted, both tokens' texts and
    (off ZeroGPU) their scores from one forward of the prompt and the common prefix (tr_core.divergence)."""
    est = dataclasses.replace(est, exact=bool(getattr(twin, "exact", False)))
    if not est.parted:
        return est
    parted = dict(est.parted)
    index, first, second = parted["index"], parted["first_token"], parted["second_token"]
    parted.update(first_text=twin.token_text(first), second_text=twin.token_text(second))
    if not zerogpu.installed() and isinstance(twin, Engine) and trace.summary is not None:
        with DECODE_SLOT:
            why = explain_at(twin, list(ids) + trace.summary.tokens[:index], index, first, second)
        parted.update(why.as_data())
    return dataclasses.replace(est, parted=parted)


def measure_rounds(studio: Studio, s: Session, twin: Any, ids: list[int], cfg: DecodeConfig,
                   stop: threading.Event, sizes: list[int] | None = None) -> Iterator[SpeedEstimate]:
    """The interleaved measurement's estimates (meter.interleave), each pass from a copy of the answer's
    starting state `twin`, drafting the answer's tree `sizes` again; on ZeroGPU they come from a GPU call."""
    max_s, chunk_ms = studio.config.measure_max_s, studio.config.measure_chunk_ms
    cfg = cfg.with_(provenance=False)  # the meter times decoding, not the microscope's records of it
    if zerogpu.installed():
        return zerogpu.measure_rounds(twin, s.model, ids, cfg, max_s, chunk_ms, sizes)

    def runs() -> tuple[Iterator, Iterator]:
        engine = twin.fork(sizes)
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
