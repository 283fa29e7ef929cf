"""A recorded answer (its step events plus the token strings they need) saved as JSON and replayed without a model.

Record on a GPU, present from a laptop: a trace holds everything the studio draws for an answer, so the
replay slider, the tree and the matrix window work from the file alone.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .events import StepEvent, SummaryEvent, event_from_dict

TRACE_FORMAT = "token-recycling-trace"
TRACE_VERSION = 1


class TraceError(ValueError):
    """A trace file is not a readable Token Recycling trace."""


@dataclass
class Trace:
    """One answer: the prompt conversation, settings, step events, summaries and the strings of every token seen."""

    model: str = ""  # model name the trace was recorded with
    settings: dict[str, Any] = field(default_factory=dict)  # DecodeConfig fields and k
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation sent as the prompt
    steps: list[StepEvent] = field(default_factory=list)  # one event per decoding step
    summary: SummaryEvent | None = None  # Token Recycling summary
    plain: SummaryEvent | None = None  # plain-decoding summary on the same prompt, if compared
    token_texts: dict[int, str] = field(default_factory=dict)  # display string of every token id in the events
    step_texts: list[str] = field(default_factory=list)  # text added by each step (joined = the answer)

    @property
    def answer(self) -> str:
        """The answer's text."""
        return "".join(self.step_texts)

    @property
    def identical(self) -> bool | None:
        """Whether Token Recycling and plain decoding produced the same tokens (None = not compared)."""
        if self.summary is None or self.plain is None:
            return None
        return self.summary.tokens == self.plain.tokens

    def token_text(self, token_id: int) -> str:
        """Display string of a token, from the recorded table (placeholder for ids not recorded)."""
        return self.token_texts.get(int(token_id), f"<{token_id}>")

    def add_step(self, ev: StepEvent, token_text: Callable[[int], str] | None = None) -> None:
        """Append a step; with `token_text`, also record the strings of every token it mentions."""
        self.steps.append(ev)
        if token_text is not None:
            self.record_texts(token_text, [ev])

    def record_texts(self, token_text: Callable[[int], str], steps: list[StepEvent] | None = None) -> None:
        """Record the display string of every token the steps mention (all steps by default)."""
        texts = self.token_texts
        for ev in self.steps if steps is None else steps:
            for ids in (ev.tokens, ev.emitted, ev.matrix_rows, *ev.matrix_values):
                for t in ids:
                    if t not in texts:
                        texts[t] = token_text(t)
            if ev.bonus is not None and ev.bonus not in texts:
                texts[ev.bonus] = token_text(ev.bonus)

    def cached_text(self, token_text: Callable[[int], str]) -> Callable[[int], str]:
        """A token_text that fills this trace's table as it goes (for drawing while recording)."""
        texts = self.token_texts

        def lookup(token_id: int) -> str:
            if token_id not in texts:
                texts[token_id] = token_text(token_id)
            return texts[token_id]

        return lookup

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (token ids become string keys, as JSON requires)."""
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "model": self.model,
            "settings": self.settings,
            "messages": self.messages,
            "steps": [e.to_dict() for e in self.steps],
            "summary": self.summary.to_dict() if self.summary else None,
            "plain": self.plain.to_dict() if self.plain else None,
            "token_texts": {str(k): v for k, v in self.token_texts.items()},
            "step_texts": self.step_texts,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        """Rebuild a trace; raises TraceError with a clear message on anything malformed."""
        if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
            raise TraceError("not a Token Recycling trace (missing \"format\": \"token-recycling-trace\")")
        if data.get("version") != TRACE_VERSION:
            raise TraceError(f"unsupported trace version {data.get('version')!r} (this app reads {TRACE_VERSION})")
        try:
            steps = [event_from_dict(d) for d in data.get("steps", [])]
            if not all(isinstance(e, StepEvent) for e in steps):
                raise TraceError("\"steps\" must hold step events only")
            summary = event_from_dict(data["summary"]) if data.get("summary") else None
            plain = event_from_dict(data["plain"]) if data.get("plain") else None
            texts = {int(k): str(v) for k, v in dict(data.get("token_texts", {})).items()}
            trace = cls(model=str(data.get("model", "")), settings=dict(data.get("settings", {})),
                        messages=list(data.get("messages", [])), steps=steps, summary=summary, plain=plain,
                        token_texts=texts, step_texts=[str(s) for s in data.get("step_texts", [])])
        except TraceError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise TraceError(f"malformed trace: {exc}") from exc
        if len(trace.step_texts) not in (0, len(trace.steps)):
            raise TraceError(f"trace has {len(trace.steps)} steps but {len(trace.step_texts)} step texts")
        return trace

    def save(self, path: str | Path) -> Path:
        """Write the trace as JSON; return the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace written by `save`; raises TraceError on a bad file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceError(f"cannot read trace {Path(path).name}: {exc}") from exc
        return cls.from_dict(data)


class TextAssembler:
    """Turns emitted token ids into text and the end offset of each step's run (for colouring the chat).

    Decodes the whole answer each step (cheap next to a forward) so multi-byte characters split across
    tokens come out right; a trailing replacement character means "incomplete", so its step ends before it.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self.boundaries: list[int] = []  # end offset of each step's text in self.text

    def push(self, emitted: list[int]) -> None:
        """Add one step's tokens."""
        self.ids.extend(emitted)
        self.text = self.decode(self.ids)
        end = len(self.text.rstrip("\ufffd"))
        self.boundaries.append(max(end, self.boundaries[-1] if self.boundaries else 0))

    def step_texts(self) -> list[str]:
        """The text added by each step (the last step also takes any trailing characters)."""
        out, start = [], 0
        for i, end in enumerate(self.boundaries):
            end = len(self.text) if i == len(self.boundaries) - 1 else end
            out.append(self.text[start:end])
            start = end
        return out


def boundaries_from_texts(step_texts: list[str]) -> list[int]:
    """End offset of each step's run in the joined text (the inverse of `TextAssembler.step_texts`)."""
    out, pos = [], 0
    for s in step_texts:
        pos += len(s)
        out.append(pos)
    return out


def record_live(engine: Any, prompt_ids: list[int], cfg: Any, trace: Trace, stop: threading.Event | None = None,
                every_s: float = 0.25, delay_s: float = 0.0) -> Iterator[list[StepEvent]]:
    """Decode in a worker thread and fold its events into `trace`; yield the new steps at most every `every_s`.

    The engine runs unhindered (it times itself; this thread only reads its events), which is what keeps a UI
    from slowing decoding. `trace.steps`, `.step_texts` and `.summary` are current at each yield; token strings
    are left to the caller (`trace.cached_text` while drawing, `trace.record_texts` afterwards). With `delay_s`,
    the worker pauses after each step (slow motion) and every step is yielded. `stop` ends the answer after the
    current step. An engine error is raised here after the steps before it were yielded.
    """
    stop = stop or threading.Event()
    events: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            for ev in engine.generate(prompt_ids, cfg, stop=stop.is_set):
                events.put(ev)
                if delay_s > 0 and isinstance(ev, StepEvent):
                    stop.wait(delay_s)  # between steps, outside the engine's timed phases
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            events.put(exc)
        finally:
            events.put(None)

    threading.Thread(target=work, daemon=True, name="tr-engine").start()
    text = TextAssembler(engine.decode)
    new: list[StepEvent] = []
    error: Exception | None = None
    last_yield = 0.0
    while True:
        try:
            item = events.get(timeout=every_s)
        except queue.Empty:
            item = "tick"
        if item is None:
            break
        if isinstance(item, Exception):
            error = item
        elif isinstance(item, StepEvent):
            trace.steps.append(item)
            text.push(item.emitted)
            new.append(item)
        elif isinstance(item, SummaryEvent):
            trace.summary = item
        now = time.monotonic()
        if new and (delay_s > 0 or now - last_yield >= every_s):
            trace.step_texts = text.step_texts()
            last_yield = now
            yield new
            new = []
    trace.step_texts = text.step_texts()
    if new:
        yield new
    if error is not None:
        raise error
