"""Visitors decode together: one loop per model owns its forwards, and every answer is a row of its batch.

An answer joins the model's loop (`BatchedEngine.generate`, a drop-in for Engine.generate), waits for a free row
(first come, first served; those getting a row at once prefill shortest first), and gets its events through a
queue of its own; its tokens are the ones it gets alone (tr_core.batch). Each step of the batch holds DECODE_SLOT,
so engine set-up and the speed meter's measurements take turns with it between steps. A stopped answer, or one
whose visitor left, frees its row after the current step.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tr_core.batch import Batch, Joining, prefill_group
from tr_core.events import SummaryEvent

from .session import DECODE_SLOT

DEFAULT_ROWS = 32  # a class of thirty at once (scripts/crowd.py, first version: p95 first text 20 s; 32 s at 16 rows)


def rows_setting() -> int:
    """Answers per shared forward: $TR_BATCH_ROWS (a positive integer), else DEFAULT_ROWS."""
    try:
        return max(1, int(os.environ.get("TR_BATCH_ROWS", DEFAULT_ROWS)))
    except ValueError:
        return DEFAULT_ROWS


ROWS = rows_setting()  # answers per shared forward; the rest wait for a row, in the order they came
IDLE_S = 0.5  # how often an idle loop looks for answers whose visitor left while waiting
# prefill time a loop turn spends on joining answers before the rows already decoding step again (4 s: the
# crowd's last first text came about 0.4 s sooner than at 2 s, scripts/crowd.py, 2026-12-06)
ADMIT_S = 4.0
HANDOFF_S = 0.002  # a pause after each step without the slot, so set-up and measurements waiting for it get it


@dataclass(eq=False)  # a ticket is itself: the line finds and removes it by identity
class Ticket:
    """One answer's request: what to decode, and where its events go."""

    engine: Any
    prompt_ids: list[int]
    cfg: Any
    stop: Callable[[], bool]
    events: queue.Queue = field(default_factory=queue.Queue)
    gone: threading.Event = field(default_factory=threading.Event)  # its consumer left: drop it


class DecodeLoop:
    """The batch of one model, stepped by a thread of its own while it has rows."""

    def __init__(self, rows: int = ROWS) -> None:
        self.batch = Batch(max_rows=rows)
        self.waiting: deque[Ticket] = deque()
        self.rows: dict[int, Ticket] = {}  # batch key -> ticket
        self.joining = 0  # answers being prefilled now (out of line, not yet in a row)
        self.wake = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True, name="tr-decode-loop")
        self.thread.start()

    def submit(self, engine: Any, prompt_ids: list[int], cfg: Any, stop: Callable[[], bool]) -> Ticket:
        """Queue an answer; its events (then None) arrive on the ticket's queue."""
        ticket = Ticket(engine, prompt_ids, cfg, stop)
        with self.wake:
            self.waiting.append(ticket)
            self.wake.notify()
        return ticket

    def place(self, ticket: Ticket) -> int:
        """0 while the answer has a row (or is done), else its place in the line for one (1 = next)."""
        with self.wake:
            for i, waiting in enumerate(self.waiting):
                if waiting is ticket:
                    return i + 1
        return 0

    def load(self) -> int:
        """Answers decoding or waiting."""
        with self.wake:
            return len(self.rows) + len(self.waiting)

    def admitting(self) -> int:
        """Answers still waiting for their first token: in line for a row, or being prefilled."""
        with self.wake:
            return len(self.waiting) + self.joining

    def _run(self) -> None:
        while True:
            with self.wake:
                while not self.waiting and not self.rows:
                    self.wake.wait(IDLE_S)
            self._admit()
            if self.rows:
                with DECODE_SLOT:
                    self._step()
                time.sleep(HANDOFF_S)

    def _admit(self) -> None:
        """Give free rows to waiting answers (a left or stopped one is dropped); they prefill as they join, several
        in one forward (tr_core.batch.prefill_group). The answers that get a row now prefill shortest prompt
        first, each showing its first token as soon as it has prefilled, for at most ADMIT_S before the rows
        already decoding take their next step."""
        began = time.monotonic()
        while not self.batch.full and (not self.rows or time.monotonic() - began < ADMIT_S):
            with self.wake:
                if not self.waiting:
                    return
                group = next_to_join(self.waiting, self.batch.max_rows - len(self.batch))
                for ticket in group:
                    self.waiting.remove(ticket)
                self.joining = len(group)
            joining = []
            for ticket in group:
                if ticket.gone.is_set() or ticket.stop():
                    ticket.events.put(None)
                else:
                    joining.append(ticket)
            try:
                if joining:
                    with DECODE_SLOT:
                        self._join(joining)
            finally:
                with self.wake:
                    self.joining = 0

    def _join(self, tickets: list[Ticket]) -> None:
        """Prefill answers into rows (one forward) and give each its first token at once where it needs no forward
        of its own."""
        try:
            keys = self.batch.add_together([Joining(t.engine, t.prompt_ids, t.cfg, stop=stopper(t)) for t in tickets])
        except Exception as exc:  # noqa: BLE001 - the shared prefill failed: these answers get the error
            keys = [exc] * len(tickets)
        for ticket, key in zip(tickets, keys):
            if isinstance(key, Exception):
                ticket.events.put(key)
                ticket.events.put(None)
            else:
                with self.wake:
                    self.rows[key] = ticket
        try:
            out = self.batch.first_steps()
        except Exception as exc:  # noqa: BLE001 - as a failed step: every answer in the batch gets the error
            self._fail_all(exc)
            return
        self._deliver(out)

    def _step(self) -> None:
        """One step of the batch."""
        try:
            out = self.batch.step()
        except Exception as exc:  # noqa: BLE001 - the shared forward failed: every answer in it gets the error
            self._fail_all(exc)
            return
        self._deliver(out)

    def _deliver(self, out: list) -> None:
        """Every event to its answer; a finished answer's queue is closed and its row forgotten."""
        for key, ev in out:
            ticket = self.rows[key]
            ticket.events.put(ev)
            if isinstance(ev, SummaryEvent):
                ticket.events.put(None)
                with self.wake:
                    del self.rows[key]

    def _fail_all(self, exc: Exception) -> None:
        for key, ticket in list(self.rows.items()):
            self.batch.cancel(key)
            ticket.events.put(exc)
            ticket.events.put(None)
        with self.wake:
            self.rows.clear()


def next_to_join(waiting: deque[Ticket], free: int) -> list[Ticket]:
    """The next answers to prefill, in one forward: of the first `free` in line (those who get a row now), the
    shortest prompts, as many as tr_core.batch.prefill_group allows."""
    line = sorted(itertools.islice(waiting, max(free, 1)), key=lambda t: len(t.prompt_ids))
    return line[: prefill_group([len(t.prompt_ids) for t in line], free)]


def stopper(ticket: Ticket) -> Callable[[], bool]:
    """Whether the answer of `ticket` should stop: its visitor left, or pressed Stop."""
    return lambda: ticket.gone.is_set() or ticket.stop()


_LOOPS: dict[int, DecodeLoop] = {}  # id(model) -> its loop (a model stays loaded for the process's life)
_LOOPS_LOCK = threading.Lock()


def loop_for(model: Any) -> DecodeLoop:
    """The decode loop of `model`, started on first use."""
    with _LOOPS_LOCK:
        if id(model) not in _LOOPS:
            _LOOPS[id(model)] = DecodeLoop()
        return _LOOPS[id(model)]


def crowd() -> int:
    """Answers decoding or waiting, over every model."""
    with _LOOPS_LOCK:
        loops = list(_LOOPS.values())
    return sum(loop.load() for loop in loops)


def newcomers() -> int:
    """Answers waiting for their first token, over every model (their prefill goes before anyone's figures)."""
    with _LOOPS_LOCK:
        loops = list(_LOOPS.values())
    return sum(loop.admitting() for loop in loops)


class BatchedEngine:
    """An engine whose answers decode in its model's shared loop; everything else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.ticket: Ticket | None = None
        self.loop = loop_for(engine.model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)  # tokenizer helpers (decode, token_text) read the engine's own

    def place(self) -> int:
        """0 once this answer decodes, else its place in the line for a row."""
        return self.loop.place(self.ticket) if self.ticket is not None else 0

    def generate(self, prompt_ids: list[int], cfg: Any, stop: Callable[[], bool] | None = None) -> Iterator[Any]:
        """The answer's events, as Engine.generate yields them; closing this generator frees its row."""
        ticket = self.ticket = self.loop.submit(self.engine, prompt_ids, cfg, stop or (lambda: False))
        try:
            while True:
                try:
                    item = ticket.events.get(timeout=IDLE_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            ticket.gone.set()

