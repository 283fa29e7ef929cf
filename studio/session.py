"""Per-visitor state: one `Session` behind a lock, created per browser tab and cleaned up when it ends; beside it the
one `Studio` every tab shares.

The session owns its engine (so its adjacency matrix: sessions never share what they learned), its
conversation, its last trace and, only once something is saved, a temporary folder. An answer in progress
is marked by `answer_stop`; New chat bumps `conversation`, so an answer of an older conversation never writes
back into the new one.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tr_core.trace import Trace

from .config import EMBEDDED, StudioConfig
from .models import ModelCatalog

DECODE_SLOT = threading.Lock()  # every decode of this process (answers, measurements, engine set-up) runs inside it
SLOT_POLL_S = 0.1  # how often a request waiting for the slot checks whether it was stopped meanwhile
TEMP_PREFIX = "tr-studio-"
BUSY = "An answer is running in this tab: press Stop (or wait for it to finish) first."


class InputError(ValueError):
    """Something a visitor sent cannot be used; the message says what to change."""


class SlotAbandoned(RuntimeError):
    """The request that waited for the decode slot was stopped (or its visitor left) before it got it."""


def take_slot(should_stop: Callable[[], bool] | None = None) -> bool:
    """Acquire the decode slot, giving up (False) once `should_stop()` turns true; a waiter never blocks forever."""
    while not DECODE_SLOT.acquire(timeout=SLOT_POLL_S):
        if should_stop is not None and should_stop():
            return False
    return True


@contextmanager
def decode_slot(should_stop: Callable[[], bool] | None = None) -> Iterator[None]:
    """Hold the decode slot for the block; raises SlotAbandoned when stopped while waiting for it."""
    if not take_slot(should_stop):
        raise SlotAbandoned("stopped while waiting for the decode slot")
    try:
        yield
    finally:
        DECODE_SLOT.release()


class PausingEngine:
    """An engine whose decode holds the slot only while it computes: slow motion's pauses between steps (taken by
    `tr_core.trace.record_live` while this generator is suspended at a step) leave the slot to other tabs."""

    def __init__(self, engine: Any, pause: bool) -> None:
        self.engine, self.pause = engine, pause  # pause: release the slot at each step (slow motion)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)  # tokenizer helpers (decode, token_text) read the engine's own

    def generate(self, prompt_ids: list[int], cfg: Any, stop: Callable[[], bool] | None = None) -> Iterator[Any]:
        """The engine's events; the slot is held from its first forward to its summary, except at each step in
        slow motion, where it is released before the step is handed on and taken again after the pause."""
        from tr_core.events import StepEvent

        if not take_slot(stop):
            return
        held, gave_up = True, False
        run = self.engine.generate(prompt_ids, cfg, stop=lambda: gave_up or (stop is not None and stop()))
        try:
            for ev in run:
                if self.pause and isinstance(ev, StepEvent):
                    DECODE_SLOT.release()
                    held = False
                    yield ev  # the consumer pauses here, without the slot
                    held = take_slot(stop)
                    gave_up = not held  # stopped while waiting: the engine sums up after this step, with no forward
                else:
                    yield ev
        finally:
            run.close()
            if held:
                DECODE_SLOT.release()


@dataclass
class Session:
    """One browser tab: its engine and matrix, conversation, last trace, and the answer in progress if any."""

    model: str = EMBEDDED  # catalogue key of the session's model
    engine: Any = None  # tr_core.Engine, created on first use (holds the session's adjacency matrix)
    k: int = 8  # candidates per matrix row of `engine`
    history: list[dict[str, str]] = field(default_factory=list)  # plain text turns sent to the model
    display: list[dict[str, str]] = field(default_factory=list)  # the same turns as shown (escaped, coloured)
    trace: Trace | None = None  # the last answer (or a loaded trace), for replay and download
    # the last answer's start: (a fork of the engine as it began, its prompt ids, its DecodeConfig), from which the
    # side-by-side times the paper's method and the hybrid on the same prompt (studio/side_by_side.py)
    last_start: tuple[Any, list[int], Any] | None = None
    conversation: int = 0  # bumped by New chat
    answer_stop: threading.Event | None = None  # set while an answer runs; .set() asks it to stop
    warm_state: dict | None = None  # the engine's state right after its warm start (Engine.snapshot()); None = empty
    warm_note: str = ""  # where the matrix's warm start came from, in plain words (shown on the page)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # guards the fields above
    _files: Path | None = None  # temporary folder, made on first save

    @property
    def answering(self) -> bool:
        """True while an answer (or its speed measurement) is running."""
        return self.answer_stop is not None

    def files(self) -> Path:
        """The session's temporary folder (made on first use)."""
        if self._files is None or not self._files.is_dir():
            self._files = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        return self._files

    def close(self) -> None:
        """The tab is gone: stop its answer and remove its files."""
        stop = self.answer_stop
        if stop is not None:
            stop.set()
        if self._files is not None:
            shutil.rmtree(self._files, ignore_errors=True)
            self._files = None


@dataclass
class Studio:
    """What handlers need besides the session, shared by every tab: the operator's settings, the shared models, the
    default tree, and this machine's forward costs."""

    config: StudioConfig
    catalog: ModelCatalog
    default_template: str = "hybrid"  # the template a new page shows (app.py: the benchmark's winner on the device)
    warm: threading.Event = field(default_factory=lambda: _set_event())  # cleared during warm-up
    # measured forward cost curves by (model, drafter): timed once on this machine, copied into every later engine
    costs: dict[tuple[str, str], Any] = field(default_factory=dict)
    # how many times a curve timed on a busy machine was thrown away to be timed again, by (model, drafter)
    retimed: dict[tuple[str, str], int] = field(default_factory=dict)
    preparing: str = ""  # what the preload is doing while `warm` is cleared (e.g. learning a warm start), for the page


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def new_session(config: StudioConfig) -> Session:
    """A fresh session on the instance's default model."""
    return Session(model=config.default_model)


def clean_text(text: Any, what: str, max_chars: int) -> str:
    """Validate text a visitor typed: a str, valid Unicode, no control characters, not too long."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise InputError(f"The {what} must be text.")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise InputError(f"The {what} contains a broken character (a lone UTF-16 surrogate); please retype it.")
    bad = next((c for c in text if c not in "\n\t" and unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise InputError(f"The {what} contains a control character (U+{ord(bad):04X}); please remove it.")
    if len(text) > max_chars:
        raise InputError(f"The {what} is {len(text):,} characters long; the limit here is {max_chars:,}.")
    return text
