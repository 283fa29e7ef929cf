"""What each field of a trace file may hold: the fields' limits and a table of specs per object.

A trace file comes from anyone: every field is checked before a Trace is built, so a bad file gives one short
TraceError (never a path); what the fields say together (tree, path, rows) is checked in tr_core/trace.py. A bound
may be a name read when checking: an upper-case one is a limit below (tests lower them), a lower-case one the length
of a field of the same object (checked first).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, dataclass, fields
from itertools import chain
from typing import Any, Callable

from .events import StepEvent, SummaryEvent

TRACE_FORMAT = "token-recycling-trace"
# 2 added where each node came from ("sources", "origins", "answer", "written", "candidate_probs"); 3 writes why a
# step drafted nothing as data ("no_draft"; 2 wrote it as text, "no_draft_reason", which is read but not kept)
TRACE_VERSION = 3
READ_VERSIONS = (1, 2, 3)  # versions the loader reads (version 1 steps have none of those fields)
VERSION_2_FIELDS = {"sources": None, "origins": None, "answer": 0, "written": None, "candidate_probs": None}  # defaults

# Limits of a trace's fields (those of its file: tr_core/trace.py). Each is far above what the app records.
MAX_STEPS = 20_000  # steps in one trace (the app stops an answer at 1024 tokens, so at 1024 steps)
MAX_NODES_PER_STEP = 1024  # draft tree nodes of one step, root included (2.2.2 has 81)
MAX_TOTAL_NODES = 2_000_000  # draft tree nodes over all steps
MAX_K = 64  # candidates per adjacency matrix row, and so candidate ranks (the app allows k <= 16)
MAX_CONTEXT_CHILDREN = 16  # context-only children of one node (hybrid trees rank them k + j, after the matrix's k)
MAX_RANK = MAX_K + MAX_CONTEXT_CHILDREN  # ranks of draft nodes are below this
MAX_ORIGIN_CHARS = 200  # longest "origins" entry (where a retrieved token was found)
MAX_REASON_CHARS = 1000  # longest "no_draft_reason" (traces of version 2, which wrote the reason as text)
NO_DRAFT_WHY = ("first step", "empty row", "cost")  # the reasons a step drafted nothing (StepEvent.no_draft)
NODE_SOURCES = ("root", "matrix", "context", "both")  # values of a step's "sources"
MAX_TOTAL_MATRIX_VALUES = 10_000_000  # matrix candidates recorded over all steps
MAX_ANSWER_TOKENS = 1_000_000  # tokens listed in one summary
TOKEN_ID_LIMIT = 2**31  # token ids are below this (a trace holds no vocabulary size)
INT_LIMIT = 2**31  # step indices, positions and summary counts are below this
FLOAT_INT_LIMIT = 2**53  # an integer given where a number is expected must be below this in size (exact as a float)
MAX_TOKEN_TEXT_CHARS = 10_000_000  # all strings of the token table together
MAX_TOKEN_TEXTS = 1_000_000  # entries of the token table (vocabularies hold up to about 262k tokens)
MAX_MESSAGES = 10_000  # turns of the prompt conversation
MAX_SETTINGS = 200  # entries of the settings
MAX_TIMINGS = 64  # timing entries of one step
MAX_STEP_SIZES = 4096  # sizes in a speed record's step_ms (a forward has at most a few hundred tokens)
MESSAGE_ROLES = ("user", "assistant", "system")
_TOKEN_KEY = re.compile("0|[1-9][0-9]{0,9}")  # a token id written as a JSON object key
_ONE_PER = {"tokens": "node", "steps": "step"}  # a list as long as "tokens" holds one item per node
ROW_VALUES = ("matrix_values", "rows_read_values", "rows_before_values")  # a step's rows of matrix candidates


class TraceError(ValueError):
    """A trace file is not a readable Token Recycling trace."""


def _bound(bound: Any, obj: dict) -> Any:
    """A bound's value: a number as is, a limit's name (upper case), or a field of `obj` (its length)."""
    if type(bound) is not str:
        return bound
    return globals()[bound] if bound.isupper() else len(obj.get(bound) or ())


# ------------------------------------------------------------------------------------------------ the specs


class Spec:
    """How one JSON value is checked: `check(value, where, obj)`, `obj` being the object that holds it."""

    noun = "values"  # what a list of them holds, in messages

    def all_ok(self, values: list, obj: dict) -> bool:
        """Whether a whole list passes, in one quick look (False: check item by item)."""
        return False


@dataclass(frozen=True)
class Value(Spec):
    """A scalar for which `test` holds."""

    test: Callable[[Any], bool]
    what: str
    noun: str = "values"

    def check(self, value: Any, where: str, obj: dict) -> None:
        if not self.test(value):
            raise TraceError(f"{where} must be {self.what}, got {_show(value)}")


@dataclass(frozen=True)
class Int(Spec):
    """An integer (not a boolean) in [lo, hi)."""

    lo: Any = 0
    hi: Any = "INT_LIMIT"
    noun = "integers"

    def check(self, value: Any, where: str, obj: dict) -> None:
        lo, hi = _bound(self.lo, obj), _bound(self.hi, obj)
        if type(value) is not int or not lo <= value < hi:
            raise TraceError(f"{where} must be an integer from {lo} to {hi - 1}, got {_show(value)}")

    def all_ok(self, values: list, obj: dict) -> bool:
        return not values or (set(map(type, values)) == {int} and _bound(self.lo, obj) <= min(values)
                              and max(values) < _bound(self.hi, obj))


@dataclass(frozen=True)
class Num(Spec):
    """A finite float, or an integer (not a boolean) exact as a float, in [lo, hi]."""

    lo: float = -math.inf
    hi: float = math.inf
    noun = "numbers"

    def check(self, value: Any, where: str, obj: dict) -> None:
        if not self.all_ok([value], obj):
            span = f" from {self.lo:g} to {self.hi:g}" if math.isfinite(self.hi) else f" >= {self.lo:g}" \
                if math.isfinite(self.lo) else ""
            raise TraceError(f"{where} must be a finite number{span}, got {_show(value)}")

    def all_ok(self, values: list, obj: dict) -> bool:
        if not values or not set(map(type, values)) <= {float, int}:
            return not values
        try:
            low, high = min(values), max(values)
            return all(map(math.isfinite, values)) and self.lo <= low and high <= self.hi \
                and -FLOAT_INT_LIMIT < low and high < FLOAT_INT_LIMIT
        except OverflowError:  # an integer too large for a float
            return False


@dataclass(frozen=True)
class Str(Spec):
    """A string of at most `max_chars` characters (every string: MAX_STRING_CHARS, tr_core/trace.py)."""
    max_chars: Any = None
    noun = "strings"

    def check(self, value: Any, where: str, obj: dict) -> None:
        if type(value) is not str:
            raise TraceError(f"{where} must be a string, got {_kind(value)}")
        limit = _bound(self.max_chars, obj)
        if limit is not None and len(value) > limit:
            raise TraceError(f"{where} has {len(value):,} characters (the limit is {limit:,})")


@dataclass(frozen=True)
class OrNull(Spec):
    """Null, or what `spec` says."""
    spec: Spec

    def check(self, value: Any, where: str, obj: dict) -> None:
        if value is not None:
            self.spec.check(value, where, obj)


@dataclass(frozen=True)
class ListOf(Spec):
    """A list of lo..hi items (or none, when `or_empty`), each as `item` says."""
    item: Spec
    lo: Any
    hi: Any
    or_empty: bool = False  # also empty (not recorded)
    noun = "lists"

    def check(self, value: Any, where: str, obj: dict) -> None:
        per = self.hi if self.lo == self.hi in obj else ""  # one item per item of that field
        _check_size(value, where, _bound(self.lo, obj), _bound(self.hi, obj), self.item.noun, self.or_empty, per)
        if not self.item.all_ok(value, obj):
            for j, x in enumerate(value):
                self.item.check(x, f"{where}[{j}]", obj)

    def all_ok(self, values: list, obj: dict) -> bool:
        lo, hi = _bound(self.lo, obj), _bound(self.hi, obj)
        sizes = set(map(len, values)) if set(map(type, values)) <= {list} else {-1}
        return all(lo <= size <= hi or (self.or_empty and size == 0) for size in sizes) \
            and self.item.all_ok(list(chain.from_iterable(values)), obj)


@dataclass(frozen=True)
class Tuple(Spec):
    """A list of one item per spec of `items`."""
    items: tuple
    noun: str = "lists"

    def check(self, value: Any, where: str, obj: dict) -> None:
        _check_size(value, where, len(self.items), len(self.items), "values")
        for j, (spec, x) in enumerate(zip(self.items, value)):
            spec.check(x, f"{where}[{j}]", obj)

    def all_ok(self, values: list, obj: dict) -> bool:
        return all(type(v) is list and len(v) == len(self.items) for v in values) \
            and all(spec.all_ok(list(place), obj) for spec, place in zip(self.items, zip(*values)))


@dataclass(frozen=True)
class Map(Spec):
    """An object of at most `hi` entries, keys as `key` says, values as `value` says."""

    value: Spec
    hi: Any
    key: Value = Value(lambda k: type(k) is str, "a string")
    max_chars: Any = None  # of all values together
    noun = "objects"

    def check(self, value: Any, where: str, obj: dict) -> None:
        hi, limit = _bound(self.hi, obj), _bound(self.max_chars, obj)
        if type(value) is not dict or len(value) > hi:
            size = f" of {len(value):,} entries" if type(value) is dict else ""
            raise TraceError(f"{where} must be an object of at most {hi:,} {self.value.noun}, got {_kind(value)}{size}")
        for key, x in value.items():
            if not self.key.test(key):
                raise TraceError(f"{where}: key {_show(key)} must be {self.key.what}")
            self.value.check(x, f"{where}[{_show(key)}]", obj)
        if limit is not None and sum(map(len, value.values())) > limit:
            raise TraceError(f"{where} holds more than {limit:,} characters")


@dataclass(frozen=True)
class Obj(Spec):
    """An object of these fields (in checking order); a file may leave out those with a default, checked as it."""

    fields: dict
    defaults: dict
    noun = "objects"

    def check(self, value: Any, where: str, obj: dict) -> None:
        if type(value) is not dict:
            raise TraceError(f"{where} must be an object, got {_kind(value)}")
        unknown = next((k for k in value if k not in self.fields), None)
        if unknown is not None:  # it would be dropped, or hide a misspelt name
            raise TraceError(f"{where or 'the trace'}: unknown field {_show(unknown)}")
        missing = [k for k in self.fields if k not in value and k not in self.defaults]
        if missing:
            raise TraceError(f"{where}: missing {', '.join(json.dumps(k) for k in missing)}")
        for name, spec in self.fields.items():
            at = f"{where}: \"{name}\"" if where else f"\"{name}\""
            spec.check(value[name] if name in value else self.defaults[name], at, value)


class Steps(Spec):
    """The step events, "step i" in messages; bounded in count, and in draft tree nodes and matrix candidates."""

    def check(self, value: Any, where: str, obj: dict) -> None:
        _check_size(value, where, 0, MAX_STEPS, "step events")
        nodes = values = 0
        for i, ev in enumerate(value):
            check_step_fields(ev, i, obj["version"])
            nodes += len(ev["tokens"])
            values += sum(len(row) for name in ROW_VALUES for row in ev.get(name, ()))
            if nodes > MAX_TOTAL_NODES:
                raise TraceError(f"the trace has more than {MAX_TOTAL_NODES:,} draft tree nodes")
            if values > MAX_TOTAL_MATRIX_VALUES:
                raise TraceError(f"the trace has more than {MAX_TOTAL_MATRIX_VALUES:,} matrix candidates")


def _check_size(value: Any, where: str, lo: int, hi: int, noun: str, or_empty: bool = False, per: str = "") -> None:
    """A list of lo..hi items (or none, when `or_empty`); `per`: the field it holds one item per item of."""
    size = len(value) if type(value) is list else -1
    if lo <= size <= hi or (or_empty and size == 0):
        return
    count = f"{hi:,}" if lo == hi else f"at most {hi:,}" if lo == 0 else f"{lo} to {hi:,}"
    per = f" (one per {_ONE_PER.get(per, f'item of {json.dumps(per)}')})" if per else ""
    count = f"0 or {count}" if or_empty else count
    raise TraceError(f"{where} must be a list of {count} {noun}{per}, got {_kind(value)}"
                     + (f" of {size:,}" if size >= 0 else ""))


# ----------------------------------------------------------------------------------------------- the tables

TOKEN, PROB = Int(0, "TOKEN_ID_LIMIT"), Num(0.0, 1.0)
BOOL = Value(lambda v: type(v) is bool, "true or false")
SETTING = Value(lambda v: v is None or type(v) in (bool, str, int) or (type(v) is float and math.isfinite(v)),
                "a string, finite number, boolean or null")
TOKEN_KEY = Value(lambda v: type(v) is str and bool(_TOKEN_KEY.fullmatch(v)) and int(v) < TOKEN_ID_LIMIT, "a token id")


def _one_of(*values: Any) -> Value:
    """One of these strings (or integers)."""
    shown = [json.dumps(v) for v in values]
    what = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
    noun = "strings" if str in map(type, values) else "values"
    return Value(lambda v: type(v) in (str, int) and v in values, what, noun)


def _per_node(item: Spec) -> ListOf:
    """One item per node of the object's "tokens"."""
    return ListOf(item, "tokens", "tokens")


def _rows(rows: str, prefix: str) -> dict[str, Spec]:
    """Rows of the adjacency matrix (tokens), their candidate tokens and their probabilities (none, or one each)."""
    return {rows: ListOf(TOKEN, 0, "tokens"), f"{prefix}_values": ListOf(ListOf(TOKEN, 1, "MAX_K"), rows, rows),
            f"{prefix}_probs": ListOf(ListOf(PROB, 0, "MAX_K"), rows, rows, or_empty=True)}


def _defaults(cls: type) -> dict[str, Any]:
    """The fields of an event that a file may leave out, with their defaults (its "kind" says what it is)."""
    return {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(cls)
            if f.name != "kind" and (f.default is not MISSING or f.default_factory is not MISSING)}


STEP = Obj({
    "kind": _one_of("step"), "step": Int(), "position": Int(),
    "tokens": ListOf(TOKEN, 1, "MAX_NODES_PER_STEP"), "parents": _per_node(Int(-1)), "depths": _per_node(Int()),
    "ranks": _per_node(Int(-1, "MAX_RANK")),
    "accepted": ListOf(Int(0, "tokens"), 1, "tokens"), "emitted": ListOf(TOKEN, 0, "accepted"), "bonus": OrNull(TOKEN),
    "timings": Map(Num(), "MAX_TIMINGS"), **_rows("matrix_rows", "matrix"),
    "node_probs": OrNull(_per_node(Num())), "template": Str(),
    "sources": OrNull(_per_node(_one_of(*NODE_SOURCES))), "origins": OrNull(_per_node(Str("MAX_ORIGIN_CHARS"))),
    "answer": Int(), "written": OrNull(_per_node(Tuple((Int(-1), Int(-1)), "[answer, step] pairs"))),
    "candidate_probs": OrNull(_per_node(PROB)),
    **_rows("rows_read", "rows_read"), **_rows("rows_before", "rows_before"),
    "choices": ListOf(TOKEN, "tokens", "tokens", or_empty=True), "no_draft_reason": OrNull(Str("MAX_REASON_CHARS")),
    "no_draft": OrNull(Obj({"why": _one_of(*NO_DRAFT_WHY), "drafts": Int(0, "MAX_NODES_PER_STEP"), "gain": Num(0.0),
                            "cost_ratio": Num(0.0), "context": BOOL}, {"drafts": 0, "gain": 0.0, "cost_ratio": 0.0,
                                                                       "context": False})),
    "unverified": OrNull(Obj({"tokens": ListOf(TOKEN, 2, "MAX_NODES_PER_STEP"),
                              "parents": _per_node(Int(-1, "MAX_NODES_PER_STEP")), "expected": _per_node(PROB)}, {})),
}, {**_defaults(StepEvent), "no_draft_reason": None})
SUMMARY = Obj({
    "kind": _one_of("summary"), "tokens": ListOf(TOKEN, 0, "MAX_ANSWER_TOKENS"),
    **dict.fromkeys(("prompt_tokens", "new_tokens", "steps", "matrix_rows_filled"), Int()),
    **dict.fromkeys(("mean_accepted", "tokens_per_s", "prefill_s", "decode_s", "wall_s", "matrix_mb", "overhead_ms",
                     "forward_ms"), Num()),
    **dict.fromkeys(("stop_reason", "method", "template"), Str()),
}, _defaults(SummaryEvent))
SPEED_NUMBERS = ("ratio", "error", "tr_tps", "plain_tps", "mean_accepted")  # numbers (or null) of a speed record
SPEED_COUNTS = ("tokens", "pairs", "covered", "left_out", "passes")  # counts of a speed record
SPEED = Obj({
    **dict.fromkeys(SPEED_NUMBERS, OrNull(Num(0.0))), **dict.fromkeys(SPEED_COUNTS, Int()),
    "trusted": BOOL, "identical": OrNull(BOOL), "reason": Str(),
    "step_ms": ListOf(Tuple((Int(1), Num(0.0), Int(1)), "[size, ms, steps] triples"), 0, "MAX_STEP_SIZES"),
}, {**dict.fromkeys(SPEED_NUMBERS), **dict.fromkeys(SPEED_COUNTS, 0), "identical": None, "reason": "", "step_ms": []})
# the fields of a speed record (tr_core.bench.meter.SpeedEstimate as a dict; tests/test_speed.py checks they agree)
SPEED_KEYS = frozenset(SPEED.fields)
TRACE = Obj({
    "format": _one_of(TRACE_FORMAT), "version": _one_of(*READ_VERSIONS), "model": Str(),
    "settings": Map(SETTING, "MAX_SETTINGS"),
    "messages": ListOf(Obj({"role": _one_of(*MESSAGE_ROLES), "content": Str()}, {}), 0, "MAX_MESSAGES"),
    "steps": Steps(), "summary": OrNull(SUMMARY), "plain": OrNull(SUMMARY),
    "token_texts": Map(Str(), "MAX_TOKEN_TEXTS", TOKEN_KEY, "MAX_TOKEN_TEXT_CHARS"),
    "step_texts": ListOf(Str(), "steps", "steps", or_empty=True), "speed": OrNull(SPEED),
}, {"model": "", "settings": {}, "messages": [], "steps": [], "summary": None, "plain": None, "token_texts": {},
    "step_texts": [], "speed": None})


# ------------------------------------------------------------------------------------------------- checking


def validate_trace_dict(data: Any) -> None:
    """Raise TraceError unless `data` is JSON of a trace's shape, of a version this app reads."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError("not a Token Recycling trace (missing \"format\": \"token-recycling-trace\")")
    version = data.get("version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise TraceError(f"unsupported trace version {_show(version)} (this app reads versions "
                         f"{', '.join(map(str, READ_VERSIONS[:-1]))} and {READ_VERSIONS[-1]})")
    TRACE.check(data, "", data)


def check_step_fields(ev: Any, i: int, version: int = TRACE_VERSION) -> None:
    """Step event `i`'s fields, as the table says and as its trace's version allows."""
    where = f"step {i}"
    STEP.check(ev, where, ev)
    if version < 2:  # (a version 1 loader would have refused these fields; their defaults are harmless)
        new = next((k for k, default in VERSION_2_FIELDS.items() if ev.get(k, default) != default), None)
        if new is not None:
            raise TraceError(f"{where}: \"{new}\" is new in trace version 2, but this trace says version {version}")
    if version >= 3 and ev.get("no_draft_reason") is not None:
        raise TraceError(f"{where}: \"no_draft_reason\" belongs to traces of version 2; version 3 writes \"no_draft\"")
    if version < 3 and ev.get("no_draft") is not None:
        raise TraceError(f"{where}: \"no_draft\" is new in trace version 3, but this trace says version {version}")


# ---------------------------------------------------------------------------------------------- in messages


def _kind(value: Any) -> str:
    """The JSON type of a value, in words."""
    names = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A short display of a scalar (other values by their kind), for messages."""
    if type(value) is float:
        return repr(value)
    if type(value) is int:
        return str(value) if abs(value) < 10**30 else "a very large integer"
    if value is None or type(value) in (bool, str):
        return _clip(json.dumps(value, ensure_ascii=True), 40)
    return _kind(value)


def _clip(text: str, limit: int) -> str:
    """Cut a string to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
