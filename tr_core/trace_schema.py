"""What each field of a trace file may hold, checked before a Trace is built (a file comes from anyone): its limits
and a table of specs per object. A bound may be a name read when checking: an upper-case one is a limit below (tests
lower them), a lower-case one the length of a field of the same object (checked first)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, dataclass, fields
from functools import partial
from typing import Any, Callable

from .context import PLACES
from .events import StepEvent, SummaryEvent

TRACE_FORMAT = "token-recycling-trace"
TRACE_VERSION = 4
READ_VERSIONS = (1, 2, 3, 4)  # versions the loader reads
# (first, last) version of step fields other versions leave at their default: 2 added where nodes came from, 3 why a
# step drafted nothing as data (2 wrote text: read, not kept), 4 origins as data (2 and 3 wrote text: dropped)
FIELD_VERSIONS = {**dict.fromkeys(("sources", "origins", "answer", "written", "candidate_probs"), (2, TRACE_VERSION)),
                  "no_draft_reason": (1, 2), "no_draft": (3, TRACE_VERSION)}

# Limits of a trace's fields (those of its file: tr_core/trace.py), each far above what the app records
MAX_STEPS = 20_000  # steps in one trace (the app stops an answer at 1024 tokens, so at 1024 steps)
MAX_NODES_PER_STEP = 1024  # draft tree nodes of one step, root included (2.2.2 has 81)
MAX_TOTAL_NODES = 2_000_000  # draft tree nodes over all steps
MAX_K = 64  # candidates per adjacency matrix row, and so candidate ranks (the app allows k <= 16)
MAX_CONTEXT_CHILDREN = 16  # context-only children of one node (hybrid trees rank them k + j, after the matrix's k)
MAX_RANK = MAX_K + MAX_CONTEXT_CHILDREN  # ranks of draft nodes are below this
MAX_ORIGIN_MATCH = 1024  # longest match an origin names (the hybrid measures up to 16 tokens)
MAX_ORIGIN_CHARS = 200  # longest origin of versions 2 and 3 (text)
MAX_REASON_CHARS = 1000  # longest "no_draft_reason" (version 2)
NO_DRAFT_WHY = ("first step", "empty row", "cost")  # the reasons a step drafted nothing (StepEvent.no_draft)
NODE_SOURCES = ("root", "matrix", "context", "both")  # values of a step's "sources"
MAX_TOTAL_MATRIX_VALUES = 10_000_000  # matrix candidates recorded over all steps
MAX_ANSWER_TOKENS = 1_000_000  # tokens listed in one summary
TOKEN_ID_LIMIT = INT_LIMIT = 2**31  # token ids (a trace holds no vocabulary size), indices and counts are below this
FLOAT_INT_LIMIT = 2**53  # numbers must be below this in size (an integer is then exact as a float)
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
_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "an object"}  # JSON types in words


class TraceError(ValueError):
    """A trace file is not a readable Token Recycling trace."""


def _bound(bound: Any, obj: dict) -> Any:
    """A bound's value: a number as is, a limit's name (upper case), or a field of `obj` (its length)."""
    if type(bound) is not str:
        return bound
    return globals()[bound] if bound.isupper() else len(obj.get(bound) or ())


class Spec:
    """How one JSON value is checked: `check(value, where, obj)`, `obj` being the object that holds it."""
    noun = "values"  # what a list of them holds, in messages


@dataclass(frozen=True)
class Leaf(Spec):
    """Scalars: `test(values, lo, hi)` says whether all of a list pass (at one quick look), its bounds read when
    checking; `what(lo, hi)` what one must be."""
    test: Callable[[list, Any, Any], bool]
    what: Callable[[Any, Any], str]
    lo: Any = None
    hi: Any = None
    noun: str = "values"

    def all_ok(self, values: list, obj: dict) -> bool:
        return self.test(values, _bound(self.lo, obj), _bound(self.hi, obj))

    def check(self, value: Any, where: str, obj: dict) -> None:
        lo, hi = _bound(self.lo, obj), _bound(self.hi, obj)
        if not self.test([value], lo, hi):
            raise TraceError(f"{where} must be {self.what(lo, hi)}, got {_show(value)}")


def Value(test: Callable[[Any], bool], what: str, noun: str = "values") -> Leaf:
    return Leaf(lambda values, lo, hi: all(map(test, values)), lambda lo, hi: what, noun=noun)


def Int(lo: Any = 0, hi: Any = "INT_LIMIT") -> Leaf:
    """An integer (not a boolean) in [lo, hi)."""
    return Leaf(lambda vs, lo, hi: not vs or (set(map(type, vs)) == {int} and lo <= min(vs) and max(vs) < hi),
                lambda lo, hi: f"an integer from {lo} to {hi - 1}", lo, hi, "integers")


def Num(lo: float = -math.inf, hi: float = math.inf) -> Leaf:
    """A number (not a boolean) in [lo, hi], and below FLOAT_INT_LIMIT in size: finite, exact if an integer. NaN fails
    a comparison where min or max is NaN, else math.isfinite (which no integer too large for a float reaches)."""
    def test(values: list, lo: float, hi: float) -> bool:
        if not values or not set(map(type, values)) <= {float, int}:
            return not values
        low, high = min(values), max(values)
        return -FLOAT_INT_LIMIT < low and high < FLOAT_INT_LIMIT and all(map(math.isfinite, values)) and lo <= low \
            and high <= hi

    span = f" from {lo:g} to {hi:g}" if hi < math.inf else f" >= {lo:g}" if lo > -math.inf else ""
    return Leaf(test, lambda lo, hi: "a finite number" + span, lo, hi, "numbers")


def Str(max_chars: Any = None) -> Leaf:
    """A string of at most `max_chars` characters (every string: MAX_STRING_CHARS, tr_core/trace.py)."""
    return Leaf(lambda vs, lo, hi: all(type(v) is str and (hi is None or len(v) <= hi) for v in vs),
                lambda lo, hi: "a string" + ("" if hi is None else f" of at most {hi:,} characters"), hi=max_chars,
                noun="strings")


def Tuple(*items: Leaf, what: str, noun: str) -> Leaf:
    """A list of one value per leaf of `items`."""
    return Leaf(lambda vs, lo, hi: all(type(v) is list and len(v) == len(items) for v in vs)
                and all(s.all_ok(list(place), {}) for s, place in zip(items, zip(*vs))), lambda lo, hi: what, noun=noun)


@dataclass(frozen=True)
class OrNull(Spec):
    """Null, or what `spec` says."""
    spec: Spec

    def check(self, value: Any, where: str, obj: dict) -> None:
        if value is not None:
            self.spec.check(value, where, obj)


@dataclass(frozen=True)
class ListOf(Spec):
    """A list of lo..hi items (or none, when `or_empty`: not recorded), each as `item` says."""
    item: Spec
    lo: Any
    hi: Any
    or_empty: bool = False
    noun = "lists"

    def check(self, value: Any, where: str, obj: dict) -> None:
        per = self.hi if self.lo == self.hi in obj else ""  # one item per item of that field
        _check_size(value, where, _bound(self.lo, obj), _bound(self.hi, obj), self.item.noun, self.or_empty, per)
        if not (isinstance(self.item, Leaf) and self.item.all_ok(value, obj)):
            for j, x in enumerate(value):
                self.item.check(x, f"{where}[{j}]", obj)


@dataclass(frozen=True)
class Map(Spec):
    """An object of at most `hi` entries, keys as `key` says, values as `value` says."""
    value: Spec
    hi: Any
    key: Leaf = Str()
    max_chars: Any = None  # of all values together
    noun = "objects"

    def check(self, value: Any, where: str, obj: dict) -> None:
        hi, limit = _bound(self.hi, obj), _bound(self.max_chars, obj)
        if type(value) is not dict or len(value) > hi:
            size = f" of {len(value):,} entries" if type(value) is dict else ""
            raise TraceError(f"{where} must be an object of at most {hi:,} {self.value.noun}, got {_kind(value)}{size}")
        if not (self.key.all_ok(list(value), obj) and self.value.all_ok(list(value.values()), obj)):
            for key, x in value.items():
                if not self.key.all_ok([key], obj):
                    raise TraceError(f"{where}: key {_show(key)} must be {self.key.what(None, None)}")
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
_per_node = partial(ListOf, lo="tokens", hi="tokens")  # one item per node of the object's "tokens"


def _one_of(*values: Any) -> Value:
    """One of these strings (or integers)."""
    shown = [json.dumps(v) for v in values]
    what = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
    return Value(lambda v: type(v) in (str, int) and v in values, what, "strings")


def _rows(rows: str, prefix: str) -> dict[str, Spec]:
    """Rows of the adjacency matrix (tokens), their candidate tokens and their probabilities (none, or one each)."""
    return {rows: ListOf(TOKEN, 0, "tokens"), f"{prefix}_values": ListOf(ListOf(TOKEN, 1, "MAX_K"), rows, rows),
            f"{prefix}_probs": ListOf(ListOf(PROB, 0, "MAX_K"), rows, rows, or_empty=True)}


def _defaults(cls: type) -> dict[str, Any]:
    """The fields of an event that a file may leave out, with their defaults (its "kind" says what it is)."""
    return {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(cls)
            if f.name != "kind" and (f.default is not MISSING or f.default_factory is not MISSING)}


ORIGIN = Obj({"where": _one_of(*PLACES), "first": Int(), "last": Int(), "match": Int(1, "MAX_ORIGIN_MATCH")}, {})
STEP = Obj({
    "kind": _one_of("step"), "step": Int(), "position": Int(),
    "tokens": ListOf(TOKEN, 1, "MAX_NODES_PER_STEP"), "parents": _per_node(Int(-1)), "depths": _per_node(Int()),
    "ranks": _per_node(Int(-1, "MAX_RANK")),
    "accepted": ListOf(Int(0, "tokens"), 1, "tokens"), "emitted": ListOf(TOKEN, 0, "accepted"), "bonus": OrNull(TOKEN),
    "timings": Map(Num(), "MAX_TIMINGS"), **_rows("matrix_rows", "matrix"),
    "node_probs": OrNull(_per_node(Num())), "template": Str(),
    "sources": OrNull(_per_node(_one_of(*NODE_SOURCES))), "origins": OrNull(_per_node(OrNull(ORIGIN))),
    "answer": Int(), "candidate_probs": OrNull(_per_node(PROB)),
    "written": OrNull(_per_node(Tuple(Int(-1), Int(-1), what="an [answer, step] pair", noun="[answer, step] pairs"))),
    **_rows("rows_read", "rows_read"), **_rows("rows_before", "rows_before"),
    "choices": ListOf(TOKEN, "tokens", "tokens", or_empty=True), "no_draft_reason": OrNull(Str("MAX_REASON_CHARS")),
    "no_draft": OrNull(Obj({"why": _one_of(*NO_DRAFT_WHY), "drafts": Int(0, "MAX_NODES_PER_STEP"), "gain": Num(0.0),
                            "cost_ratio": Num(0.0), "context": BOOL},
                           {"drafts": 0, "gain": 0.0, "cost_ratio": 0.0, "context": False})),
    "unverified": OrNull(Obj({"tokens": ListOf(TOKEN, 2, "MAX_NODES_PER_STEP"),
                              "parents": _per_node(Int(-1, "MAX_NODES_PER_STEP")), "expected": _per_node(PROB)}, {})),
}, {**_defaults(StepEvent), "no_draft_reason": None})
TEXT_ORIGINS = Obj({**STEP.fields, "origins": OrNull(_per_node(Str("MAX_ORIGIN_CHARS")))}, STEP.defaults)  # 2 and 3
SUMMARY = Obj({
    "kind": _one_of("summary"), "tokens": ListOf(TOKEN, 0, "MAX_ANSWER_TOKENS"),
    **dict.fromkeys(("prompt_tokens", "new_tokens", "steps", "matrix_rows_filled"), Int()),
    **dict.fromkeys(("mean_accepted", "tokens_per_s", "prefill_s", "decode_s", "wall_s", "matrix_mb", "overhead_ms",
                     "forward_ms"), Num()),
    **dict.fromkeys(("stop_reason", "method", "template"), Str()),
}, _defaults(SummaryEvent))
SPEED_NUMBERS = ("ratio", "error", "tr_tps", "plain_tps", "mean_accepted")  # numbers (or null) of a speed record
SPEED_COUNTS = ("tokens", "pairs", "covered", "left_out", "passes")  # counts of a speed record
# where the measurement's two runs parted (tr_core.divergence.Divergence, with the two tokens' texts); the scores are
# null where they could not be computed
PARTED = Obj({"index": Int(), "first_token": TOKEN, "second_token": TOKEN, "first_text": Str(MAX_REASON_CHARS),
              "second_text": Str(MAX_REASON_CHARS), "first_logit": OrNull(Num()), "second_logit": OrNull(Num()),
              "gap": OrNull(Num(0.0)), "dtype": Str(MAX_REASON_CHARS), "fix": Str(MAX_REASON_CHARS)},
             {"first_text": "", "second_text": "", "first_logit": None, "second_logit": None, "gap": None,
              "dtype": "", "fix": ""})
SPEED = Obj({
    **dict.fromkeys(SPEED_NUMBERS, OrNull(Num(0.0))), **dict.fromkeys(SPEED_COUNTS, Int()),
    "trusted": BOOL, "identical": OrNull(BOOL), "reason": Str(),
    "step_ms": ListOf(Tuple(Int(1), Num(0.0), Int(1), what="a [size, ms, steps] triple",
                            noun="[size, ms, steps] triples"), 0, "MAX_STEP_SIZES"),
    "exact": OrNull(BOOL), "parted": OrNull(PARTED),
}, {**dict.fromkeys(SPEED_NUMBERS), **dict.fromkeys(SPEED_COUNTS, 0), "identical": None, "reason": "", "step_ms": [],
    "exact": None, "parted": None})
SPEED_KEYS = frozenset(SPEED.fields)  # studio/meter.py's SpeedEstimate as a dict (tests/test_speed.py: they agree)
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
    """Step event `i`'s fields, as the table of its trace's version says."""
    where = f"step {i}"
    (STEP if version >= 4 else TEXT_ORIGINS).check(ev, where, ev)
    for name, (first, last) in FIELD_VERSIONS.items():
        if ev.get(name, STEP.defaults[name]) != STEP.defaults[name] and not first <= version <= last:
            said = f"is new in trace version {first}" if version < first else f"belongs to versions {first} to {last}"
            raise TraceError(f"{where}: \"{name}\" {said}, but this trace says version {version}")


# ---------------------------------------------------------------------------------------------- in messages
def _kind(value: Any) -> str:
    """The JSON type of a value, in words."""
    return _KINDS.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A short display of a scalar (other values by their kind), for messages."""
    if type(value) is int and abs(value) >= 10**30:
        return "a very large integer"
    if value is None or type(value) in (bool, str, int, float):
        text = repr(value) if type(value) is float else json.dumps(value, ensure_ascii=True)
        return text if len(text) <= 40 else text[:39] + "…"
    return _kind(value)
