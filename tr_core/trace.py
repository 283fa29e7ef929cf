"""A recorded answer (its step events plus the token strings they need) saved as JSON and replayed without a model.

Record on a GPU, present from a laptop: a trace holds everything the studio draws for an answer, so the
replay slider, the tree and the matrix window work from the file alone. What a trace file may hold, and the checks
of a file from anyone, are in tr_core/trace_schema.py.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .events import StepEvent, SummaryEvent, event_from_dict
from .trace_schema import SPEED_KEYS, TRACE_FORMAT, TRACE_VERSION, TraceError, check_step_fields, validate_trace_dict

__all__ = ["SPEED_KEYS", "TRACE_FORMAT", "TRACE_VERSION", "TextAssembler", "Trace", "TraceError",
           "boundaries_from_texts", "check_step", "check_trace", "read_trace_json"]

# Limits of a trace file (visitors of the public app upload them; its fields' limits: tr_core/trace_schema.py)
MAX_TRACE_BYTES = 10 * 1024 * 1024  # largest file Trace.load reads (a 1024-token answer, 2.2.2, k = 16: about 5 MB)
MAX_JSON_DEPTH = 64  # deepest nesting of lists and objects (a trace nests 5 levels deep)
MAX_STRING_CHARS = 200_000  # longest single string: a message, a step's text, a token's text, the model name
MAX_TOTAL_CHARS = 20_000_000  # all strings of a trace together
_SCALARS = {int, float, bool, type(None)}  # JSON values that hold no strings and no nesting
_SURROGATE = re.compile("[\\ud800-\\udfff]")  # a lone surrogate: not encodable as UTF-8


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
    speed: dict[str, Any] | None = None  # the interleaved speed measurement (speed.SpeedEstimate as a dict)

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
            for ids in (ev.tokens, ev.emitted, ev.matrix_rows, *ev.matrix_values, *ev.rows_read_values,
                        *ev.rows_before_values, ev.choices):
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
            "speed": self.speed,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        """Rebuild a trace; raises TraceError with a clear message on anything malformed."""
        check_trace(data)
        try:
            steps = [event_from_dict(d) for d in data.get("steps", [])]
            summary = event_from_dict(data["summary"]) if data.get("summary") is not None else None
            plain = event_from_dict(data["plain"]) if data.get("plain") is not None else None
            return cls(model=data.get("model", ""), settings=dict(data.get("settings", {})),
                       messages=[dict(m) for m in data.get("messages", [])], steps=steps, summary=summary, plain=plain,
                       token_texts={int(k): v for k, v in data.get("token_texts", {}).items()},
                       step_texts=list(data.get("step_texts", [])), speed=data.get("speed"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a safety net: validation comes first
            raise TraceError(f"malformed trace: {exc}") from exc

    def save(self, path: str | Path) -> Path:
        """Write the trace as JSON; return the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> "Trace":
        """Read a trace written by `save`; raises TraceError on a bad or too large file."""
        return cls.from_dict(read_trace_json(path, max_bytes))


def read_trace_json(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> Any:
    """Parse a trace file's JSON; refuse files over `max_bytes`, non-UTF-8 text, bad JSON and deep nesting."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise TraceError(f"the trace file is too large ({_mb(size)}; the limit is {_mb(max_bytes)})")
            raw = f.read(max_bytes + 1)
    except OSError:
        raise TraceError("cannot read the trace file") from None
    if len(raw) > max_bytes:
        raise TraceError(f"the trace file is too large (over {_mb(max_bytes)})")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TraceError("cannot read the trace file: it is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"cannot read the trace file: not valid JSON ({exc.msg} at line {exc.lineno} "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"the trace is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError:  # e.g. an integer of thousands of digits
        raise TraceError("cannot read the trace file: not valid JSON") from None


def check_json_shape(data: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Check the nesting depth and every string (length, lone surrogates) of parsed JSON, without recursion."""
    total = 0
    stack: list[tuple[Any, int, tuple]] = [(data, 1, ())] if isinstance(data, (dict, list)) else []
    while stack:
        obj, depth, path = stack.pop()
        if depth > max_depth:
            raise TraceError(f"the trace is nested more than {max_depth} levels deep")
        if type(obj) is list and (set(map(type, obj)) <= _SCALARS or depth < max_depth and _rows_of_scalars(obj)):
            continue  # a list of numbers, or of lists of numbers: nothing to look into
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if type(key) is str:
                total += _check_string(key, path)
            if type(value) is str:
                total += _check_string(value, (path, key))
            elif isinstance(value, (dict, list)):
                stack.append((value, depth + 1, (path, key)))
        if total > MAX_TOTAL_CHARS:
            raise TraceError(f"the trace holds more than {MAX_TOTAL_CHARS:,} characters of text")


def _rows_of_scalars(obj: list) -> bool:
    """Whether a list holds lists of numbers only (rows of the matrix: one quick look instead of one per row)."""
    return set(map(type, obj)) == {list} and all(set(map(type, row)) <= _SCALARS for row in obj)


def _check_string(text: str, path: tuple) -> int:
    """Refuse an over-long string or one with a lone surrogate; return its length."""
    if len(text) > MAX_STRING_CHARS:
        raise TraceError(f"{_path(path)}: a string of {len(text):,} characters (the limit is {MAX_STRING_CHARS:,})")
    if _SURROGATE.search(text):
        raise TraceError(f"{_path(path)}: a string holds a lone surrogate (invalid Unicode)")
    return len(text)


def _path(path: tuple) -> str:
    """'steps[3].tokens' from the linked (parent, key) tuples of check_json_shape."""
    keys: list[Any] = []
    while path:
        path, key = path
        keys.append(key)
    out = "".join(f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{json.dumps(k)}]"
                  for k in reversed(keys)).lstrip(".")
    out = out or "the trace"
    return out if len(out) <= 80 else out[:79] + "…"


def _mb(size: int) -> str:
    """A byte count in MB."""
    return f"{size / 1024 / 1024:.1f} MB"


# ----------------------------------------------------------------------------------- what a step's fields mean
# tr_core/trace_schema.py checks each field of a trace (type, range, length); these check what a step's fields say
# together, so that everything the studio draws from a step is consistent.


def check_trace(data: Any) -> None:
    """Raise TraceError unless `data` is a well-formed trace: its strings and nesting, its fields, then what each
    step's fields say together."""
    check_json_shape(data)
    validate_trace_dict(data)
    for i, ev in enumerate(data.get("steps", [])):
        check_step_meaning(ev, f"step {i}")


def check_step(ev: Any, i: int, version: int = TRACE_VERSION) -> None:
    """Validate step event `i` of a trace of `version`: its fields, then its tree, accepted path and matrix rows."""
    check_step_fields(ev, i, version)
    check_step_meaning(ev, f"step {i}")


def check_step_meaning(ev: dict, where: str) -> None:
    """A step whose fields are valid: its draft tree, accepted path, undrafted tree and matrix rows agree."""
    _check_tree(ev, where)
    _check_path(ev, where)
    _check_no_draft(ev, where)
    _check_rows(ev, where)


def _check_tree(ev: dict, where: str) -> None:
    """The draft tree: node 0 is the root; every other node's parent comes before it, one level up."""
    parents, depths, ranks, sources = ev["parents"], ev["depths"], ev["ranks"], ev.get("sources") or ["root"]
    if parents[0] != -1 or depths[0] != 0 or ranks[0] != -1:
        raise TraceError(f"{where}: the root (node 0) must have parent -1, depth 0 and rank -1")
    for j in range(1, len(parents)):
        p = parents[j]
        if not 0 <= p < j:
            raise TraceError(f"{where}: parent of node {j} is {p}, must be between 0 and {j - 1}")
        if depths[j] != depths[p] + 1:
            raise TraceError(f"{where}: depth of node {j} is {depths[j]}, must be {depths[p] + 1} (its parent's + 1)")
        if ranks[j] < 0:
            raise TraceError(f"{where}: rank of node {j} is {ranks[j]}, must be >= 0")
    wrong = next((j for j, source in enumerate(sources) if (source == "root") != (j == 0)), None)  # (hybrid trees)
    if wrong is not None:
        allowed = "\"root\"" if wrong == 0 else "\"matrix\", \"context\" or \"both\""
        raise TraceError(f"{where}: source of node {wrong} is {json.dumps(sources[wrong])}, must be {allowed}")


def _check_path(ev: dict, where: str) -> None:
    """accepted: a path down from the root; emitted: its draft tokens, then the bonus token (cut by a stop)."""
    accepted, parents, tokens, emitted, bonus = (ev[k] for k in ("accepted", "parents", "tokens", "emitted", "bonus"))
    if accepted[0] != 0:
        raise TraceError(f"{where}: the accepted path must start at the root (node 0)")
    for prev, node in zip(accepted, accepted[1:]):
        if parents[node] != prev:
            raise TraceError(f"{where}: the accepted path is broken: node {node} follows {prev}, "
                             f"but its parent is {parents[node]}")
    for j, (token, node) in enumerate(zip(emitted, accepted[1:])):
        if token != tokens[node]:
            raise TraceError(f"{where}: emitted token {j} is {token}, but accepted node {node} holds {tokens[node]}")
    if bonus is None and len(emitted) == len(accepted):
        raise TraceError(f"{where}: the last emitted token is a bonus token, but \"bonus\" is null")
    if bonus is not None and (len(emitted) != len(accepted) or emitted[-1] != bonus):
        raise TraceError(f"{where}: the bonus token {bonus} must be emitted last, after the accepted draft tokens")


def _check_no_draft(ev: dict, where: str) -> None:
    """no_draft (or a version 2 trace's no_draft_reason) and unverified: only on a step that verified its root alone;
    that root heads the unverified tree, whose parents come before their children."""
    tree = ev.get("unverified")
    if tree is None and ev.get("no_draft") is None and ev.get("no_draft_reason") is None:
        return
    if len(ev["tokens"]) != 1:
        raise TraceError(f"{where}: \"no_draft\" and \"unverified\" belong to a step that drafted nothing, "
                         f"but this step drafted {len(ev['tokens']) - 1} nodes")
    if tree is None:
        return
    parents = tree["parents"]
    if parents[0] != -1 or not all(0 <= parents[j] < j for j in range(1, len(parents))):
        raise TraceError(f"{where}: \"unverified\" parents must be -1 for the root, then an earlier node's index")
    if tree["tokens"][0] != ev["tokens"][0]:
        raise TraceError(f"{where}: the unverified tree's root is not the step's root")


def _check_rows(ev: dict, where: str) -> None:
    """Matrix rows: each probability row as wide as its row of candidates; rows read and rows written unread (as
    they were before the step): distinct tokens of the tree, apart, the latter written, all of one k."""
    for name in ("matrix", "rows_read", "rows_before"):
        values, probs = ev.get(f"{name}_values", []), ev.get(f"{name}_probs", [])
        bad = next((j for j, row in enumerate(probs) if len(row) != len(values[j])), None)
        if bad is not None:
            raise TraceError(f"{where}: \"{name}_probs\"[{bad}] must be a list of {len(values[bad])} numbers "
                             f"(one per candidate), got a list of {len(probs[bad])}")
    read, before = ev.get("rows_read", []), ev.get("rows_before", [])
    for name, rows in (("rows_read", read), ("rows_before", before)):
        if len(set(rows)) != len(rows) or not set(rows) <= set(ev["tokens"]):
            raise TraceError(f"{where}: \"{name}\" must list distinct tokens of the step's tree")
    if set(before) & set(read) or not set(before) <= set(ev.get("matrix_rows", [])):
        raise TraceError(f"{where}: \"rows_before\" must list rows the step wrote (\"matrix_rows\") and did not "
                         "read (\"rows_read\")")
    widths = sorted({len(row) for name in ("rows_read_values", "rows_before_values") for row in ev.get(name, [])})
    if len(widths) > 1:
        raise TraceError(f"{where}: \"rows_read_values\" and \"rows_before_values\" hold rows of {widths[0]} and "
                         f"{widths[-1]} candidates (one k per matrix)")


class TextAssembler:
    """Turns emitted token ids into text and the end offset of each step's run (colouring the chat; `unshown` streams).

    Decodes the whole answer each step (cheap next to a forward) so multi-byte characters split across
    tokens come out right; a trailing replacement character means "incomplete", so its step ends before it.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self.boundaries: list[int] = []  # end offset of each step's text in self.text
        self.shown = ""  # the text handed out by `unshown` so far

    def push(self, emitted: list[int]) -> None:
        """Add one step's tokens."""
        self.ids.extend(emitted)
        self.text = self.decode(self.ids)
        end = len(self.text.rstrip("\ufffd"))
        self.boundaries.append(max(end, self.boundaries[-1] if self.boundaries else 0))

    def unshown(self, final: bool = False) -> str:
        """The stable text (all of it when `final`) not handed out yet; '' while decoding rewrites what was."""
        if not self.text.startswith(self.shown):
            return ""
        end = len(self.text) if final or not self.boundaries else self.boundaries[-1]
        new = self.text[len(self.shown):end]
        self.shown += new
        return new

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
