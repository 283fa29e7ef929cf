"""A recorded answer (its step events plus the token strings they need) saved as JSON and replayed without a model.

Record on a GPU, present from a laptop: a trace holds everything the studio draws for an answer, so the
replay slider, the tree and the matrix window work from the file alone.
"""
from __future__ import annotations

import json
import math
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator

from .events import StepEvent, SummaryEvent, event_from_dict

TRACE_FORMAT = "token-recycling-trace"
# written by this version; 2 added where each node came from: the steps' "sources" and "origins" (hybrid trees)
# and "answer", "written", "candidate_probs" (which step's logits wrote each drafted candidate)
TRACE_VERSION = 2
READ_VERSIONS = (1, 2)  # versions the loader reads (version 1 steps have none of those fields)
VERSION_2_FIELDS = ("sources", "origins", "answer", "written", "candidate_probs")

# Limits of a trace (visitors of the public app upload them). Each is far above what the app records.
MAX_TRACE_BYTES = 10 * 1024 * 1024  # largest file Trace.load reads (a 1024-token answer, 2.2.2, k = 16: about 5 MB)
MAX_JSON_DEPTH = 64  # deepest nesting of lists and objects (a trace nests 5 levels deep)
MAX_STEPS = 20_000  # steps in one trace (the app stops an answer at 1024 tokens, so at 1024 steps)
MAX_NODES_PER_STEP = 1024  # draft tree nodes of one step, root included (2.2.2 has 81)
MAX_TOTAL_NODES = 2_000_000  # draft tree nodes over all steps
MAX_K = 64  # candidates per adjacency matrix row, and so candidate ranks (the app allows k <= 16)
MAX_CONTEXT_CHILDREN = 16  # context-only children of one node (hybrid trees rank them k + j, after the matrix's k)
MAX_RANK = MAX_K + MAX_CONTEXT_CHILDREN  # ranks of draft nodes are below this
MAX_ORIGIN_CHARS = 200  # longest "origins" entry (where a retrieved token was found)
NODE_SOURCES = ("root", "matrix", "context", "both")  # values of a step's "sources"
MAX_TOTAL_MATRIX_VALUES = 10_000_000  # matrix candidates recorded over all steps
MAX_ANSWER_TOKENS = 1_000_000  # tokens listed in one summary
TOKEN_ID_LIMIT = 2**31  # token ids are below this (a trace holds no vocabulary size)
INT_LIMIT = 2**31  # step indices, positions and summary counts are below this
FLOAT_INT_LIMIT = 2**53  # an integer given where a number is expected must be below this in size (exact as a float)
MAX_STRING_CHARS = 200_000  # longest single string: a message, a step's text, a token's text, the model name
MAX_TOTAL_CHARS = 20_000_000  # all strings of a trace together
MAX_TOKEN_TEXT_CHARS = 10_000_000  # all strings of the token table together
MAX_TOKEN_TEXTS = 1_000_000  # entries of the token table (vocabularies hold up to about 262k tokens)
MAX_MESSAGES = 10_000  # turns of the prompt conversation
MAX_SETTINGS = 200  # entries of the settings
MAX_TIMINGS = 64  # timing entries of one step
MESSAGE_ROLES = ("user", "assistant", "system")
_SCALARS = {int, float, bool, type(None)}  # JSON values that hold no strings and no nesting
_SURROGATE = re.compile("[\\ud800-\\udfff]")  # a lone surrogate: not encodable as UTF-8
_TOKEN_KEY = re.compile("0|[1-9][0-9]{0,9}")  # a token id written as a JSON object key


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
        validate_trace_dict(data)
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


# ------------------------------------------------------------------------------------------- validation
# A trace file comes from anyone: everything the studio draws is checked before a Trace is built, so that a
# bad file gives one short TraceError (never a path) instead of an IndexError while drawing.

TRACE_KEYS = frozenset({"format", "version"} | {f.name for f in fields(Trace)})  # fields of a trace file
STEP_KEYS = frozenset(f.name for f in fields(StepEvent))  # fields of a step event
SUMMARY_KEYS = frozenset(f.name for f in fields(SummaryEvent))  # fields of a summary event


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


def validate_trace_dict(data: Any) -> None:
    """Raise TraceError unless `data` is a well-formed trace of this version (everything the studio draws)."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError("not a Token Recycling trace (missing \"format\": \"token-recycling-trace\")")
    version = data.get("version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise TraceError(f"unsupported trace version {_show(version)} (this app reads versions "
                         f"{', '.join(map(str, READ_VERSIONS[:-1]))} and {READ_VERSIONS[-1]})")
    _check_known(data, TRACE_KEYS, "the trace")
    check_json_shape(data)
    _check_str(data.get("model", ""), "\"model\"")
    check_settings(data.get("settings", {}))
    check_messages(data.get("messages", []))
    steps = data.get("steps", [])
    check_steps(steps, version)
    for key in ("summary", "plain"):
        if data.get(key) is not None:
            check_summary(data[key], f"\"{key}\"")
    check_token_texts(data.get("token_texts", {}))
    check_step_texts(data.get("step_texts", []), len(steps))
    if data.get("speed") is not None:
        check_speed(data["speed"])


SPEED_NUMBERS = ("ratio", "error", "tr_tps", "plain_tps", "mean_accepted")  # numbers (or null) of a speed record
SPEED_COUNTS = ("tokens", "pairs", "covered", "left_out", "passes")  # counts of a speed record
# the fields of a speed record (tr_core.bench.meter.SpeedEstimate as a dict; tests/test_speed.py checks they agree)
SPEED_KEYS = frozenset((*SPEED_NUMBERS, *SPEED_COUNTS, "trusted", "reason", "identical", "step_ms"))


def check_speed(speed: Any) -> None:
    """The recorded speed measurement: numbers or nulls, counts, a trusted flag and a reason."""
    if type(speed) is not dict:
        raise TraceError(f"\"speed\" must be an object, got {_kind(speed)}")
    _check_known(speed, SPEED_KEYS, "\"speed\"")
    for name in SPEED_NUMBERS:
        value = speed.get(name)
        if value is not None and (not _is_number(value) or value < 0):
            raise TraceError(f"\"speed\": \"{name}\" must be a non-negative number or null, got {_show(value)}")
    for name in SPEED_COUNTS:
        _check_int(speed.get(name, 0), f"\"speed\": \"{name}\"", 0, INT_LIMIT)
    if type(speed.get("trusted")) is not bool:
        raise TraceError("\"speed\": \"trusted\" must be true or false")
    if speed.get("identical") is not None and type(speed.get("identical")) is not bool:
        raise TraceError("\"speed\": \"identical\" must be true, false or null")
    _check_str(speed.get("reason", ""), "\"speed\": \"reason\"")
    check_step_ms(speed.get("step_ms", []))


MAX_STEP_SIZES = 4096  # sizes in a speed record's step_ms (a forward has at most a few hundred tokens)


def check_step_ms(value: Any) -> None:
    """A speed record's Token Recycling steps by size: [tokens in the forward, mean ms, steps] triples."""
    where = "\"speed\": \"step_ms\""
    if type(value) is not list or len(value) > MAX_STEP_SIZES:
        raise TraceError(f"{where} must be a list of at most {MAX_STEP_SIZES} [size, ms, steps] triples, got "
                         f"{_kind(value)}" + (f" of {len(value)}" if type(value) is list else ""))
    for j, triple in enumerate(value):
        if type(triple) is not list or len(triple) != 3:
            raise TraceError(f"{where}[{j}] must be a [size, ms, steps] triple, got {_kind(triple)}")
        _check_int(triple[0], f"{where}[{j}][0]", 1, INT_LIMIT)
        _check_numbers(triple[1:2], f"{where}[{j}][1]", 1, 1, lo=0.0)
        _check_int(triple[2], f"{where}[{j}][2]", 1, INT_LIMIT)


def check_json_shape(data: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Check the nesting depth and every string (length, lone surrogates) of parsed JSON, without recursion."""
    total = 0
    stack: list[tuple[Any, int, tuple]] = [(data, 1, ())] if isinstance(data, (dict, list)) else []
    while stack:
        obj, depth, path = stack.pop()
        if depth > max_depth:
            raise TraceError(f"the trace is nested more than {max_depth} levels deep")
        if type(obj) is list and set(map(type, obj)) <= _SCALARS:  # a list of numbers: nothing to look into
            continue
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if type(key) is str:
                total += _check_string(key, path)
            if type(value) is str:
                total += _check_string(value, (path, key))
            elif isinstance(value, (dict, list)):
                stack.append((value, depth + 1, (path, key)))
        if total > MAX_TOTAL_CHARS:
            raise TraceError(f"the trace holds more than {MAX_TOTAL_CHARS:,} characters of text")


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
    return _clip(out or "the trace", 80)


def _check_sized(value: Any, typ: type, name: str, limit: int) -> None:
    """A top-level list or object of at most `limit` entries."""
    if type(value) is not typ:
        raise TraceError(f"\"{name}\" must be {'a list' if typ is list else 'an object'}, got {_kind(value)}")
    if len(value) > limit:
        raise TraceError(f"\"{name}\" has {len(value):,} entries (the limit is {limit:,})")


def check_settings(settings: Any) -> None:
    """Settings: an object of at most MAX_SETTINGS names, each a string, number, boolean or null."""
    _check_sized(settings, dict, "settings", MAX_SETTINGS)
    for name, value in settings.items():
        if type(name) is not str:
            raise TraceError("\"settings\": names must be strings")
        ok = value is None or type(value) in (bool, str, int) or (type(value) is float and math.isfinite(value))
        if not ok:
            raise TraceError(f"\"settings\": {_show(name)} must be a string, finite number, boolean or null, "
                             f"got {_show(value)}")


def check_messages(messages: Any) -> None:
    """Messages: a list of {"role": user/assistant/system, "content": string}."""
    _check_sized(messages, list, "messages", MAX_MESSAGES)
    for i, m in enumerate(messages):
        where = f"message {i}"
        if type(m) is not dict or set(m) != {"role", "content"}:
            raise TraceError(f"{where}: must be an object with exactly \"role\" and \"content\"")
        if m["role"] not in MESSAGE_ROLES:
            raise TraceError(f"{where}: role {_show(m['role'])} must be one of {', '.join(MESSAGE_ROLES)}")
        _check_str(m["content"], f"{where}: \"content\"")


def check_steps(steps: Any, version: int = TRACE_VERSION) -> None:
    """Steps: a bounded list of valid step events (of a trace of `version`)."""
    _check_sized(steps, list, "steps", MAX_STEPS)
    nodes = values = 0
    for i, ev in enumerate(steps):
        n, v = check_step(ev, i, version)
        nodes, values = nodes + n, values + v
        if nodes > MAX_TOTAL_NODES:
            raise TraceError(f"the trace has more than {MAX_TOTAL_NODES:,} draft tree nodes")
        if values > MAX_TOTAL_MATRIX_VALUES:
            raise TraceError(f"the trace has more than {MAX_TOTAL_MATRIX_VALUES:,} matrix candidates")


STEP_REQUIRED = ("step", "position", "tokens", "parents", "depths", "ranks", "accepted", "emitted", "bonus", "timings")


def check_step(ev: Any, i: int, version: int = TRACE_VERSION) -> tuple[int, int]:
    """Validate step event `i` (types, tree, accepted path, sources, matrix rows); return its nodes and candidates."""
    where = f"step {i}"
    if type(ev) is not dict:
        raise TraceError(f"{where}: must be an object, got {_kind(ev)}")
    if ev.get("kind") != "step":
        raise TraceError(f"{where}: \"kind\" must be \"step\", got {_show(ev.get('kind'))}")
    _check_known(ev, STEP_KEYS, where)
    missing = [k for k in STEP_REQUIRED if k not in ev]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(json.dumps(k) for k in missing)}")
    for name in ("step", "position"):
        _check_int(ev[name], f"{where}: \"{name}\"", 0, INT_LIMIT)
    n = _check_tree(ev, where)
    _check_path(ev, n, where)
    _check_timings(ev["timings"], where)
    node_probs = ev.get("node_probs")
    if node_probs is not None:
        _check_numbers(node_probs, f"{where}: \"node_probs\"", n, n)
    _check_str(ev.get("template", ""), f"{where}: \"template\"")
    _check_sources(ev, n, where, version)
    _check_provenance(ev, n, where, version)
    _check_no_draft(ev, n, where)
    return n, _check_matrix(ev, n, where) + _check_reads(ev, n, where)


MAX_REASON_CHARS = 1000  # longest "no_draft_reason"


def _check_no_draft(ev: dict, n: int, where: str) -> None:
    """no_draft_reason (a string) and unverified ({"tokens", "parents" (root -1, each before its children),
    "expected" (one number in [0, 1] per node)}): None, or set on a step that verified its root alone."""
    reason, tree = ev.get("no_draft_reason"), ev.get("unverified")
    if reason is None and tree is None:
        return
    if n != 1:
        raise TraceError(f"{where}: \"no_draft_reason\" and \"unverified\" belong to a step that drafted nothing, "
                         f"but this step drafted {n - 1} nodes")
    if reason is not None:
        _check_str(reason, f"{where}: \"no_draft_reason\"")
        if len(reason) > MAX_REASON_CHARS:
            raise TraceError(f"{where}: \"no_draft_reason\" is longer than {MAX_REASON_CHARS} characters")
    if tree is None:
        return
    if type(tree) is not dict or set(tree) != {"tokens", "parents", "expected"}:
        raise TraceError(f"{where}: \"unverified\" must be an object with exactly tokens, parents and expected")
    tokens = _check_ints(tree["tokens"], f"{where}: \"unverified\" tokens", 0, TOKEN_ID_LIMIT, MAX_NODES_PER_STEP, 2)
    m = len(tokens)
    parents = _check_ints(tree["parents"], f"{where}: \"unverified\" parents", -1, MAX_NODES_PER_STEP, m, m)
    if parents[0] != -1 or not all(0 <= parents[i] < i for i in range(1, m)):
        raise TraceError(f"{where}: \"unverified\" parents must be -1 for the root, then an earlier node's index")
    _check_numbers(tree["expected"], f"{where}: \"unverified\" expected", m, m, 0.0, 1.0)
    if tokens[0] != ev["tokens"][0]:
        raise TraceError(f"{where}: the unverified tree's root is not the step's root")


def _check_provenance(ev: dict, n: int, where: str, version: int) -> None:
    """answer, written ([answer, step] per node, -1 for unknown), candidate_probs (one in [0, 1] per node)."""
    if version < 2:  # (a version 1 loader would have refused these keys; their defaults are harmless)
        new = next((k for k, default in (("answer", 0), ("written", None), ("candidate_probs", None))
                    if ev.get(k, default) != default), None)
        if new is not None:
            raise TraceError(f"{where}: \"{new}\" is new in trace version 2, but this trace says version {version}")
        return
    if "answer" in ev:
        _check_int(ev["answer"], f"{where}: \"answer\"", 0, INT_LIMIT)
    written = ev.get("written")
    if written is not None:
        if type(written) is not list or len(written) != n:
            raise TraceError(f"{where}: \"written\" must be a list of {n} [answer, step] pairs (one per node), "
                             f"got {_kind(written)}")
        for j, pair in enumerate(written):
            _check_ints(pair, f"{where}: \"written\"[{j}]", -1, INT_LIMIT, 2, 2)
    if ev.get("candidate_probs") is not None:
        _check_numbers(ev["candidate_probs"], f"{where}: \"candidate_probs\"", n, n, 0.0, 1.0)


def _check_tree(ev: dict, where: str) -> int:
    """tokens/parents/depths/ranks: one entry per node; a tree with parents before children; return N."""
    tokens = _check_ints(ev["tokens"], f"{where}: \"tokens\"", 0, TOKEN_ID_LIMIT, MAX_NODES_PER_STEP, 1)
    n = len(tokens)
    for name in ("parents", "depths", "ranks"):
        if type(ev[name]) is list and len(ev[name]) != n:
            raise TraceError(f"{where}: \"{name}\" has {len(ev[name])} items but \"tokens\" has {n}")
    parents = _check_ints(ev["parents"], f"{where}: \"parents\"", -1, INT_LIMIT, n, n)
    depths = _check_ints(ev["depths"], f"{where}: \"depths\"", 0, INT_LIMIT, n, n)
    ranks = _check_ints(ev["ranks"], f"{where}: \"ranks\"", -1, MAX_RANK, n, n)
    if parents[0] != -1 or depths[0] != 0 or ranks[0] != -1:
        raise TraceError(f"{where}: the root (node 0) must have parent -1, depth 0 and rank -1")
    for j in range(1, n):
        p = parents[j]
        if not 0 <= p < j:
            raise TraceError(f"{where}: parent of node {j} is {p}, must be between 0 and {j - 1}")
        if depths[j] != depths[p] + 1:
            raise TraceError(f"{where}: depth of node {j} is {depths[j]}, must be {depths[p] + 1} (its parent's + 1)")
        if ranks[j] < 0:
            raise TraceError(f"{where}: rank of node {j} is {ranks[j]}, must be >= 0")
    return n


def _check_path(ev: dict, n: int, where: str) -> None:
    """accepted: a path down from the root; emitted: its draft tokens, then the bonus token (cut by a stop)."""
    accepted = _check_ints(ev["accepted"], f"{where}: \"accepted\"", 0, INT_LIMIT, n)
    if not accepted or accepted[0] != 0:
        raise TraceError(f"{where}: the accepted path must start at the root (node 0)")
    parents, tokens = ev["parents"], ev["tokens"]
    for prev, node in zip(accepted, accepted[1:]):
        if node >= n:
            raise TraceError(f"{where}: accepted node {node} is out of range (the tree has {n} nodes)")
        if parents[node] != prev:
            raise TraceError(f"{where}: the accepted path is broken: node {node} follows {prev}, "
                             f"but its parent is {parents[node]}")
    emitted = _check_ints(ev["emitted"], f"{where}: \"emitted\"", 0, TOKEN_ID_LIMIT, len(accepted))
    for j, (token, node) in enumerate(zip(emitted, accepted[1:])):
        if token != tokens[node]:
            raise TraceError(f"{where}: emitted token {j} is {token}, but accepted node {node} holds {tokens[node]}")
    bonus = ev["bonus"]
    if bonus is None:
        if len(emitted) == len(accepted):
            raise TraceError(f"{where}: the last emitted token is a bonus token, but \"bonus\" is null")
        return
    _check_int(bonus, f"{where}: \"bonus\"", 0, TOKEN_ID_LIMIT)
    if len(emitted) != len(accepted) or emitted[-1] != bonus:
        raise TraceError(f"{where}: the bonus token {bonus} must be emitted last, after the accepted draft tokens")


def _check_sources(ev: dict, n: int, where: str, version: int) -> None:
    """sources/origins (version 2, hybrid trees): one entry per node; "root" at node 0 only; short origins."""
    for name in ("sources", "origins"):
        value = ev.get(name)
        if value is None:
            continue
        if version < 2:
            raise TraceError(f"{where}: \"{name}\" is new in trace version 2, but this trace says version {version}")
        if type(value) is not list or len(value) != n:
            size = f" of {len(value)}" if type(value) is list else ""
            raise TraceError(f"{where}: \"{name}\" must be a list of {n} strings (one per node), "
                             f"got {_kind(value)}{size}")
        bad = next((j for j, x in enumerate(value) if type(x) is not str), None)
        if bad is not None:
            raise TraceError(f"{where}: \"{name}\"[{bad}] must be a string, got {_kind(value[bad])}")
    sources, origins = ev.get("sources"), ev.get("origins")
    if sources is not None:
        for j, source in enumerate(sources):
            if source not in NODE_SOURCES or (source == "root") != (j == 0):
                allowed = "\"root\"" if j == 0 else "\"matrix\", \"context\" or \"both\""
                raise TraceError(f"{where}: source of node {j} is {_show(source)}, must be {allowed}")
    if origins is not None:
        long = next((j for j, x in enumerate(origins) if len(x) > MAX_ORIGIN_CHARS), None)
        if long is not None:
            raise TraceError(f"{where}: origin of node {long} has {len(origins[long]):,} characters "
                             f"(the limit is {MAX_ORIGIN_CHARS})")


def _check_timings(timings: Any, where: str) -> None:
    """timings: an object of at most MAX_TIMINGS names to finite numbers (milliseconds)."""
    if type(timings) is not dict or len(timings) > MAX_TIMINGS:
        raise TraceError(f"{where}: \"timings\" must be an object of at most {MAX_TIMINGS} numbers")
    for name, value in timings.items():
        if type(name) is not str or not _is_number(value):
            raise TraceError(f"{where}: timing {_show(name)} must be a finite number, got {_show(value)}")


def _check_matrix(ev: dict, n: int, where: str) -> int:
    """matrix_rows/values/probs: one row of at most MAX_K candidates per rewritten row; return the candidates."""
    rows = _check_ints(ev.get("matrix_rows", []), f"{where}: \"matrix_rows\"", 0, TOKEN_ID_LIMIT, n)
    values, probs = ev.get("matrix_values", []), ev.get("matrix_probs", [])
    for name, table in (("matrix_values", values), ("matrix_probs", probs)):
        if type(table) is not list:
            raise TraceError(f"{where}: \"{name}\" must be a list of rows, got {_kind(table)}")
    if len(values) != len(rows) or len(probs) not in (0, len(rows)):
        raise TraceError(f"{where}: {len(rows)} matrix rows, but {len(values)} rows of candidates "
                         f"and {len(probs)} rows of probabilities")
    total = 0
    for j, row in enumerate(values):
        vals = _check_ints(row, f"{where}: \"matrix_values\"[{j}]", 0, TOKEN_ID_LIMIT, MAX_K, 1)
        if probs:
            _check_numbers(probs[j], f"{where}: \"matrix_probs\"[{j}]", len(vals), len(vals), 0.0, 1.0)
        total += len(vals)
    return total


def _check_reads(ev: dict, n: int, where: str) -> int:
    """rows_read/values/probs (the rows the draft read, before the step) and rows_before/values/probs (the rows it
    wrote but did not read, before it: none read, all written): distinct tokens of the tree, one row of candidates
    each, all of one length; choices: empty or one token per node. Return the candidates."""
    read = _check_rows(ev, "rows_read", n, where)
    before = _check_rows(ev, "rows_before", n, where)
    if set(before[0]) & set(read[0]) or not set(before[0]) <= set(ev.get("matrix_rows", [])):
        raise TraceError(f"{where}: \"rows_before\" must list rows the step wrote (\"matrix_rows\") and did not "
                         "read (\"rows_read\")")
    if read[1] and before[1] and read[1] != before[1]:
        raise TraceError(f"{where}: rows read hold {read[1]} and rows before {before[1]} candidates (one k per matrix)")
    choices = ev.get("choices", [])
    if choices != []:
        _check_ints(choices, f"{where}: \"choices\"", 0, TOKEN_ID_LIMIT, n, n)
    return len(read[0]) * read[1] + len(before[0]) * before[1]


def _check_rows(ev: dict, name: str, n: int, where: str) -> tuple[list[int], int]:
    """`name` (rows: distinct tokens of the tree), `name`_values (one row of candidates each, of one length) and
    `name`_probs (none, or one probability per candidate): (the rows, candidates per row; 0 with no row)."""
    rows = _check_ints(ev.get(name, []), f"{where}: \"{name}\"", 0, TOKEN_ID_LIMIT, n)
    if len(set(rows)) != len(rows) or not set(rows) <= set(ev["tokens"]):
        raise TraceError(f"{where}: \"{name}\" must list distinct tokens of the step's tree")
    values, probs = ev.get(f"{name}_values", []), ev.get(f"{name}_probs", [])
    if type(values) is not list or type(probs) is not list or len(values) != len(rows) \
            or len(probs) not in (0, len(rows)):
        raise TraceError(f"{where}: {len(rows)} rows in \"{name}\", but \"{name}_values\" and \"{name}_probs\" "
                         f"are not lists of {len(rows)} rows")
    width = None
    for j, row in enumerate(values):
        vals = _check_ints(row, f"{where}: \"{name}_values\"[{j}]", 0, TOKEN_ID_LIMIT, MAX_K, 1)
        if width is not None and len(vals) != width:
            raise TraceError(f"{where}: rows in \"{name}\" hold {width} and {len(vals)} candidates (one k per matrix)")
        width = len(vals)
        if probs:
            _check_numbers(probs[j], f"{where}: \"{name}_probs\"[{j}]", width, width, 0.0, 1.0)
    return rows, width or 0


def check_summary(summary: Any, where: str) -> None:
    """A summary event: counts, finite numbers, strings and the answer's token ids."""
    if type(summary) is not dict or summary.get("kind") != "summary":
        raise TraceError(f"{where} must be a summary event (an object with \"kind\": \"summary\")")
    _check_known(summary, SUMMARY_KEYS, where)
    for name in ("prompt_tokens", "new_tokens", "steps", "matrix_rows_filled"):
        _check_int(summary.get(name), f"{where}: \"{name}\"", 0, INT_LIMIT)
    for name in ("mean_accepted", "tokens_per_s", "prefill_s", "decode_s", "wall_s", "matrix_mb",
                 "overhead_ms", "forward_ms"):
        value = summary.get(name, 0.0) if name in ("overhead_ms", "forward_ms") else summary.get(name)  # newer two
        if not _is_number(value):
            raise TraceError(f"{where}: \"{name}\" must be a finite number, got {_show(value)}")
    for name in ("stop_reason", "method", "template"):
        _check_str(summary.get(name), f"{where}: \"{name}\"")
    _check_ints(summary.get("tokens"), f"{where}: \"tokens\"", 0, TOKEN_ID_LIMIT, MAX_ANSWER_TOKENS)


def check_token_texts(texts: Any) -> None:
    """The token table: decimal token ids (as strings) to strings, bounded in entries and characters."""
    _check_sized(texts, dict, "token_texts", MAX_TOKEN_TEXTS)
    total = 0
    for key, value in texts.items():
        if type(key) is not str or not _TOKEN_KEY.fullmatch(key) or int(key) >= TOKEN_ID_LIMIT:
            raise TraceError(f"\"token_texts\": key {_show(key)} is not a token id")
        _check_str(value, f"\"token_texts\"[{key}]")
        total += len(value)
    if total > MAX_TOKEN_TEXT_CHARS:
        raise TraceError(f"\"token_texts\" holds more than {MAX_TOKEN_TEXT_CHARS:,} characters")


def check_step_texts(texts: Any, steps: int) -> None:
    """step_texts: empty, or one string per step."""
    if type(texts) is not list:
        raise TraceError(f"\"step_texts\" must be a list, got {_kind(texts)}")
    if len(texts) not in (0, steps):
        raise TraceError(f"trace has {steps} steps but {len(texts)} step texts")
    for i, text in enumerate(texts):
        _check_str(text, f"step text {i}")


def _check_known(obj: dict, known: frozenset, where: str) -> None:
    """Refuse fields a trace does not have (they would be dropped, or hide a misspelt name)."""
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise TraceError(f"{where}: unknown field {_show(unknown[0])}")


def _check_int(value: Any, where: str, lo: int, hi: int) -> int:
    """An integer (not a boolean) in [lo, hi)."""
    if type(value) is not int or not lo <= value < hi:
        raise TraceError(f"{where} must be an integer from {lo} to {hi - 1}, got {_show(value)}")
    return value


def _check_ints(value: Any, where: str, lo: int, hi: int, max_len: int, min_len: int = 0) -> list[int]:
    """A list of min_len..max_len integers (not booleans) in [lo, hi)."""
    if type(value) is not list:
        raise TraceError(f"{where} must be a list of integers, got {_kind(value)}")
    if not min_len <= len(value) <= max_len:
        count = f"{min_len} to {max_len}" if min_len < max_len else f"{max_len}"
        raise TraceError(f"{where} has {len(value)} items, must have {count}")
    if value and not (set(map(type, value)) == {int} and lo <= min(value) and max(value) < hi):
        j, bad = next((j, x) for j, x in enumerate(value) if type(x) is not int or not lo <= x < hi)
        raise TraceError(f"{where}[{j}] must be an integer from {lo} to {hi - 1}, got {_show(bad)}")
    return value


def _check_numbers(value: Any, where: str, min_len: int, max_len: int, lo: float = -math.inf,
                   hi: float = math.inf) -> None:
    """A list of min_len..max_len finite numbers in [lo, hi]."""
    if type(value) is not list or not min_len <= len(value) <= max_len:
        count = f"{min_len} to {max_len}" if min_len < max_len else f"{max_len}"
        raise TraceError(f"{where} must be a list of {count} numbers, got {_kind(value)}"
                         + (f" of {len(value)}" if type(value) is list else ""))
    if _all_numbers(value, lo, hi):
        return
    for j, x in enumerate(value):
        if not _is_number(x) or not lo <= x <= hi:
            span = f" from {lo:g} to {hi:g}" if math.isfinite(lo) and math.isfinite(hi) else ""
            raise TraceError(f"{where}[{j}] must be a finite number{span}, got {_show(x)}")


def _all_numbers(values: list, lo: float, hi: float) -> bool:
    """Fast check that all values are finite numbers in [lo, hi] (False: look item by item)."""
    if not values or not set(map(type, values)) <= {float, int}:
        return not values
    try:
        low, high = min(values), max(values)
        return all(map(math.isfinite, values)) and lo <= low and high <= hi and -FLOAT_INT_LIMIT < low \
            and high < FLOAT_INT_LIMIT
    except OverflowError:  # an integer too large for a float
        return False


def _check_str(value: Any, where: str) -> None:
    """A string (its length and characters are checked by check_json_shape)."""
    if type(value) is not str:
        raise TraceError(f"{where} must be a string, got {_kind(value)}")


def _is_number(value: Any) -> bool:
    """A finite float, or an integer (not a boolean) small enough to be exact as a float."""
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and -FLOAT_INT_LIMIT < value < FLOAT_INT_LIMIT


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


def _mb(size: int) -> str:
    """A byte count in MB."""
    return f"{size / 1024 / 1024:.1f} MB"


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
