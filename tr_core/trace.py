"""A recorded answer (its step events plus the token strings they need) saved as JSON and replayed without a model:
record on a GPU, present from a laptop. Here are its file's limits and what a step's fields say together; what the
fields may hold is in tr_core/trace_schema.py."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from itertools import accumulate, chain
from pathlib import Path
from typing import Any, Callable

from .events import StepEvent, SummaryEvent, event_from_dict
from .trace_schema import SPEED_KEYS, TRACE_FORMAT, TRACE_VERSION, TraceError, check_step_fields, validate_trace_dict

__all__ = ["SPEED_KEYS", "TRACE_FORMAT", "TRACE_VERSION", "TextAssembler", "Trace", "TraceError",
           "boundaries_from_texts", "check_step"]

# Limits of a trace file (visitors of the public app upload them)
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
    speed: dict[str, Any] | None = None  # the interleaved speed measurement (studio/meter.py's SpeedEstimate, a dict)

    @property
    def answer(self) -> str:
        return "".join(self.step_texts)

    @property
    def identical(self) -> bool | None:
        """Whether Token Recycling and plain decoding produced the same tokens (None = not compared)."""
        return None if self.summary is None or self.plain is None else self.summary.tokens == self.plain.tokens

    def token_text(self, token_id: int) -> str:
        """Display string of a token from the recorded table (a placeholder for ids not recorded)."""
        return self.token_texts.get(int(token_id), f"<{token_id}>")

    def add_step(self, ev: StepEvent, token_text: Callable[[int], str]) -> None:
        """Append a step and record the strings of every token it mentions."""
        self.steps.append(ev)
        self.record_texts(token_text, [ev])

    def record_texts(self, token_text: Callable[[int], str], steps: list[StepEvent] | None = None) -> None:
        """Record the display string of every token the steps mention (all steps by default)."""
        texts = self.token_texts
        for ev in self.steps if steps is None else steps:
            for t in chain(ev.tokens, ev.emitted, ev.matrix_rows, *ev.matrix_values, *ev.rows_read_values,
                           *ev.rows_before_values, ev.choices, () if ev.bonus is None else (ev.bonus,)):
                if t not in texts:
                    texts[t] = token_text(t)

    def cached_text(self, token_text: Callable[[int], str]) -> Callable[[int], str]:
        """A token_text that fills this trace's table as it goes (for drawing while recording)."""
        texts = self.token_texts
        return lambda t: texts[t] if t in texts else texts.setdefault(t, token_text(t))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (token ids become string keys, as JSON requires)."""
        data = {"format": TRACE_FORMAT, "version": TRACE_VERSION, **asdict(self)}
        return {**data, "token_texts": {str(k): v for k, v in self.token_texts.items()}}

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        """Rebuild a trace, or TraceError on anything malformed (the text origins of versions 2 and 3 are dropped)."""
        check_json_shape(data)
        validate_trace_dict(data)
        for i, ev in enumerate(data.get("steps", [])):
            _check_step_meaning(ev, i)
        try:
            text_origins = data["version"] < 4
            steps = [event_from_dict({**d, "origins": None} if text_origins else d) for d in data.get("steps", [])]
            summary, plain = (None if data.get(k) is None else event_from_dict(data[k]) for k in ("summary", "plain"))
            return cls(model=data.get("model", ""), settings=dict(data.get("settings", {})),
                       messages=[dict(m) for m in data.get("messages", [])], steps=steps, summary=summary, plain=plain,
                       token_texts={int(k): v for k, v in data.get("token_texts", {}).items()},
                       step_texts=list(data.get("step_texts", [])), speed=data.get("speed"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a safety net: validation comes first
            raise TraceError(f"malformed trace: {exc}") from exc

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> "Trace":
        """Read a trace written by `save`; TraceError on a file over `max_bytes`, not UTF-8 text, not JSON, too deep."""
        try:
            with open(path, "rb") as f:
                raw = f.read(max_bytes + 1)
        except OSError:
            raise TraceError("cannot read the trace file") from None
        if len(raw) > max_bytes:
            raise TraceError(f"the trace file is too large (over {max_bytes / 1024 / 1024:.1f} MB)")
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise TraceError("cannot read the trace file: it is not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise TraceError(f"cannot read the trace file: not valid JSON ({exc.msg} at line {exc.lineno} "
                             f"column {exc.colno})") from None
        except RecursionError:
            raise TraceError(f"the trace is nested more than {MAX_JSON_DEPTH} levels deep") from None
        except ValueError:  # e.g. an integer of thousands of digits
            raise TraceError("cannot read the trace file: not valid JSON") from None
        return cls.from_dict(data)


def check_json_shape(data: Any) -> None:
    """Check the nesting depth and every string (length, lone surrogates) of parsed JSON, without recursion."""
    total = 0
    stack: list[tuple[Any, int, tuple]] = [(data, 1, ())] if isinstance(data, (dict, list)) else []  # path: its keys
    while stack:
        obj, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise TraceError(f"the trace is nested more than {MAX_JSON_DEPTH} levels deep")
        kinds = set(map(type, obj)) if type(obj) is list else None
        if kinds is not None and (kinds <= _SCALARS or depth < MAX_JSON_DEPTH and kinds == {list}
                                  and all(set(map(type, row)) <= _SCALARS for row in obj)):
            continue  # numbers, or rows of numbers: nothing to look into
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if type(key) is str:
                total += _check_string(key, path)
            if type(value) is str:
                total += _check_string(value, (*path, key))
            elif isinstance(value, (dict, list)):
                stack.append((value, depth + 1, (*path, key)))
        if total > MAX_TOTAL_CHARS:
            raise TraceError(f"the trace holds more than {MAX_TOTAL_CHARS:,} characters of text")


def _check_string(text: str, path: tuple) -> int:
    """Refuse an over-long string or one with a lone surrogate; return its length."""
    if len(text) > MAX_STRING_CHARS or _SURROGATE.search(text):
        where = "".join(f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{json.dumps(k)}]"
                        for k in path).lstrip(".") or "the trace"  # 'steps[3].tokens'
        where = where if len(where) <= 80 else where[:79] + "…"
        what = f"a string of {len(text):,} characters (the limit is {MAX_STRING_CHARS:,})" \
            if len(text) > MAX_STRING_CHARS else "a string holds a lone surrogate (invalid Unicode)"
        raise TraceError(f"{where}: {what}")
    return len(text)


def check_step(ev: Any, i: int, version: int = TRACE_VERSION) -> None:
    """Raise TraceError unless step `i` of a trace of `version` has the fields its table says, and they agree."""
    check_step_fields(ev, i, version)
    _check_step_meaning(ev, i)


def _check_step_meaning(ev: dict, i: int) -> None:
    """Raise TraceError unless a step whose fields are valid agrees with itself."""
    for check in (_tree_problem, _path_problem, _undrafted_problem, _rows_problem):
        if problem := check(ev):
            raise TraceError(f"step {i}: {problem}")


def _tree_problem(ev: dict) -> str | None:
    """Node 0 is the root; every other node's parent comes before it, one level up; only copied nodes have an
    origin (as data: version 4 writes them, 2 and 3 wrote text)."""
    parents, depths, ranks = ev["parents"], ev["depths"], ev["ranks"]
    if (parents[0], depths[0], ranks[0]) != (-1, 0, -1):
        return "the root (node 0) must have parent -1, depth 0 and rank -1"
    for j, p in enumerate(parents[1:], 1):
        if not 0 <= p < j:
            return f"parent of node {j} is {p}, must be between 0 and {j - 1}"
        if depths[j] != depths[p] + 1:
            return f"depth of node {j} is {depths[j]}, must be {depths[p] + 1} (its parent's + 1)"
        if ranks[j] < 0:
            return f"rank of node {j} is {ranks[j]}, must be >= 0"
    sources = ev.get("sources") or ["root"]
    j = next((j for j, source in enumerate(sources) if (source == "root") != (j == 0)), None)
    if j is not None:
        return f"source of node {j} is {json.dumps(sources[j])}, must be " + (
            "\"root\"" if j == 0 else "\"matrix\", \"context\" or \"both\"")
    copied = [s in ("context", "both") for s in ev.get("sources") or ()]
    if any(type(o) is not str and (not copied or (o is not None) != copied[j] or (o and o["first"] > o["last"]))
           for j, o in enumerate(ev.get("origins") or ())):
        return "\"origins\" must say where each copied node was found (\"first\" <= \"last\"), and nothing else"
    return None


def _path_problem(ev: dict) -> str | None:
    """accepted: a path down from the root; emitted: its draft tokens, then the bonus token (cut by a stop)."""
    accepted, parents, tokens, emitted, bonus = (ev[k] for k in ("accepted", "parents", "tokens", "emitted", "bonus"))
    if accepted[0] != 0:
        return "the accepted path must start at the root (node 0)"
    for prev, node in zip(accepted, accepted[1:]):
        if parents[node] != prev:
            return f"the accepted path is broken: node {node} follows {prev}, but its parent is {parents[node]}"
    for j, (token, node) in enumerate(zip(emitted, accepted[1:])):
        if token != tokens[node]:
            return f"emitted token {j} is {token}, but accepted node {node} holds {tokens[node]}"
    if bonus is None and len(emitted) == len(accepted):
        return "the last emitted token is a bonus token, but \"bonus\" is null"
    if bonus is not None and (len(emitted) != len(accepted) or emitted[-1] != bonus):
        return f"the bonus token {bonus} must be emitted last, after the accepted draft tokens"
    return None


def _undrafted_problem(ev: dict) -> str | None:
    """Why a step drafted nothing (no_draft; version 2: no_draft_reason) and the tree it did not draft, only on such
    a step; that tree hangs off its root, parents before children."""
    if all(ev.get(k) is None for k in ("unverified", "no_draft", "no_draft_reason")):
        return None
    if len(ev["tokens"]) != 1:
        return ("\"no_draft\" and \"unverified\" belong to a step that drafted nothing, but this step drafted "
                f"{len(ev['tokens']) - 1} nodes")
    tree = ev.get("unverified") or {"tokens": ev["tokens"], "parents": [-1]}
    if tree["parents"][0] != -1 or not all(0 <= p < j for j, p in enumerate(tree["parents"]) if j):
        return "\"unverified\" parents must be -1 for the root, then an earlier node's index"
    if tree["tokens"][0] != ev["tokens"][0]:
        return "the unverified tree's root is not the step's root"
    return None


def _rows_problem(ev: dict) -> str | None:
    """Each row of probabilities as wide as its row of candidates; the rows read and those written unread (as they
    were before the step) distinct tokens of the tree, apart, the latter written, all of one k."""
    for name in ("matrix", "rows_read", "rows_before"):
        for j, (values, probs) in enumerate(zip(ev.get(f"{name}_values", []), ev.get(f"{name}_probs", []))):
            if len(probs) != len(values):
                return (f"\"{name}_probs\"[{j}] must be a list of {len(values)} numbers (one per candidate), got a "
                        f"list of {len(probs)}")
    read, before = ev.get("rows_read", []), ev.get("rows_before", [])
    for name, rows in (("rows_read", read), ("rows_before", before)):
        if len(set(rows)) != len(rows) or not set(rows) <= set(ev["tokens"]):
            return f"\"{name}\" must list distinct tokens of the step's tree"
    if set(before) & set(read) or not set(before) <= set(ev.get("matrix_rows", [])):
        return "\"rows_before\" must list rows the step wrote (\"matrix_rows\") and did not read (\"rows_read\")"
    widths = sorted({len(row) for name in ("rows_read_values", "rows_before_values") for row in ev.get(name, [])})
    if len(widths) > 1:
        return (f"\"rows_read_values\" and \"rows_before_values\" hold rows of {widths[0]} and {widths[-1]} candidates "
                "(one k per matrix)")
    return None


class TextAssembler:
    """Emitted token ids as text, with the end offset of each step's run (colouring the chat; `unshown` streams). It
    decodes the whole answer each step (cheap next to a forward), so characters split across tokens come out right;
    a trailing replacement character means "incomplete", so its step ends before it."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self.boundaries: list[int] = []  # end offset of each step's text in self.text
        self.shown = ""  # the text handed out by `unshown` so far

    def push(self, emitted: list[int]) -> None:
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
        ends = [*self.boundaries[:-1], len(self.text)] if self.boundaries else []
        return [self.text[start:end] for start, end in zip([0, *ends], ends)]


def boundaries_from_texts(step_texts: list[str]) -> list[int]:
    """End offset of each step's run in the joined text (the inverse of `TextAssembler.step_texts`)."""
    return list(accumulate(map(len, step_texts)))
