"""A decode recorded live for the studio: the engine runs in a worker thread, its events fold into a `Trace`."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

from tr_core.events import StepEvent, SummaryEvent
from tr_core.trace import TextAssembler, Trace


def record_live(engine: Any, prompt_ids: list[int], cfg: Any, trace: Trace, stop: threading.Event | None = None,
                every_s: float | Callable[[], float] = 0.25, delay_s: float = 0.0, slot: Any = None,
                time_limit_s: float | None = None, abandon_s: float = 15.0,
                ticks: bool = False) -> Iterator[list[StepEvent]]:
    """Decode in a worker thread and fold its events into `trace`; yield the new steps at most every `every_s`.

    The engine runs unhindered (it times itself; this thread only reads its events), which is what keeps a UI
    from slowing decoding. `trace.steps`, `.step_texts` and `.summary` are current at each yield; token strings
    are left to the caller (`trace.cached_text` while drawing, `trace.record_texts` afterwards). With `delay_s`,
    the worker pauses after each step (slow motion) and every step is yielded. `stop` ends the answer after the
    current step; so does `time_limit_s` (seconds of wall time) and a consumer that stopped asking for steps
    for `abandon_s` seconds. `every_s` may be a function, asked at each yield (a crowd redraws less often);
    `ticks`: yield an empty list every `every_s` until the first step (a waiting answer's page can say so). `slot` (a lock) is held by the worker while it decodes: one decode at a time.
    The decode belongs to the consumer: closing this generator (or an error in it) stops the worker within
    one step and joins it. An engine error is raised here after the steps before it were yielded.
    """
    stop = stop or threading.Event()
    events: queue.Queue = queue.Queue()
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    seen = [time.monotonic(), False]  # when the consumer last resumed, whether it is suspended at a yield

    def abandoned() -> bool:
        return seen[1] and time.monotonic() - seen[0] > abandon_s

    closing = threading.Event()  # set when the consumer leaves early: the worker stops after its step

    def should_stop() -> bool:
        return (stop.is_set() or closing.is_set() or (deadline is not None and time.monotonic() > deadline)
                or abandoned())

    worker = threading.Thread(target=_decode_worker, daemon=True, name="tr-engine",
                              args=(engine, prompt_ids, cfg, events, should_stop, delay_s, slot))
    worker.start()
    try:
        yield from _fold_events(events, trace, engine.decode, every_s, delay_s, seen, ticks)
    finally:
        closing.set()
        worker.join()
    if deadline is not None and time.monotonic() > deadline and trace.summary is not None:
        trace.summary.stop_reason = "time limit" if trace.summary.stop_reason == "stopped" else trace.summary.stop_reason


def _decode_worker(engine: Any, prompt_ids: list[int], cfg: Any, events: queue.Queue, should_stop: Callable[[], bool],
                   delay_s: float, slot: Any) -> None:
    """The engine thread of `record_live`: decode (holding `slot`), putting every event, an error, then None."""
    held = False
    try:
        while slot is not None and not held:
            held = slot.acquire(timeout=0.1)
            if not held and should_stop():
                return
        for ev in engine.generate(prompt_ids, cfg, stop=should_stop):
            events.put(ev)
            if delay_s > 0 and isinstance(ev, StepEvent):
                _pause(delay_s, should_stop)  # between steps, outside the engine's timed phases
    except Exception as exc:  # noqa: BLE001 - handed to the consumer
        events.put(exc)
    finally:
        if held:
            slot.release()
        events.put(None)


def _pause(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Sleep up to `seconds`, waking early when `should_stop()` turns true."""
    end = time.monotonic() + seconds
    while not should_stop() and time.monotonic() < end:
        time.sleep(min(0.05, max(end - time.monotonic(), 0.0)))


def _fold_events(events: queue.Queue, trace: Trace, decode: Callable[[list[int]], str],
                 every_s: float | Callable[[], float], delay_s: float, seen: list,
                 ticks: bool = False) -> Iterator[list[StepEvent]]:
    """The consumer side of `record_live`: fold events into the trace and yield batches of new steps."""
    text = TextAssembler(decode)
    new: list[StepEvent] = []
    error: Exception | None = None
    last_yield = 0.0
    while True:
        interval = every_s() if callable(every_s) else every_s
        try:
            item = events.get(timeout=interval)
        except queue.Empty:
            item = "tick"
        if item is None:
            break
        if item == "tick" and ticks and not trace.steps:
            seen[1] = True
            yield []  # still waiting for the first step
            seen[0], seen[1] = time.monotonic(), False
            continue
        if isinstance(item, Exception):
            error = item
        elif isinstance(item, StepEvent):
            trace.steps.append(item)
            text.push(item.emitted)
            new.append(item)
        elif isinstance(item, SummaryEvent):
            trace.summary = item
        now = time.monotonic()
        if new and (delay_s > 0 or now - last_yield >= interval):
            trace.step_texts = text.step_texts()
            last_yield = now
            seen[1] = True
            yield new
            seen[0], seen[1] = time.monotonic(), False
            new = []
    trace.step_texts = text.step_texts()
    if new:
        yield new
    if error is not None:
        raise error
