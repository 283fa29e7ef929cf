"""Validation of uploaded trace files: every malformed trace gives a TraceError, never another exception."""
from __future__ import annotations

import copy
import json
import math
import random

import pytest

from tr_core import trace as trace_mod
from tr_core import trace_schema as schema
from tr_core.context import PLACES
from tr_core.events import StepEvent, SummaryEvent
from present.chart import accepted_chart
from present.heatmap import MatrixTracker, heatmap_figure
from present.tree import tree_figure
from tr_core.trace import Trace, TraceError

VOCAB = {0: "<root>", 1: " the", 2: " cat", 3: " sat", 4: " dog", 5: "the", 6: "\n", 7: " on", 8: " mat", 9: "!"}
TIMINGS = {"draft": 0.1, "forward": 10.0, "verify": 0.2, "commit": 0.1, "update": 0.3, "total": 10.7}


def text_of(t: int) -> str:
    return VOCAB.get(t, f"<{t}>")


HYBRID_SOURCES = ["root", "both", "matrix", "context", "matrix", "context", "context"]
PROMPT_RUN = {"where": "prompt", "first": 2, "match": 2}  # a run copied from the prompt, from its 3rd token
HYBRID_ORIGINS = [None, {**PROMPT_RUN, "last": 2}, None, {**PROMPT_RUN, "last": 3}, None,
                  {"where": "answer", "first": 8, "last": 8, "match": 1}, {**PROMPT_RUN, "last": 4}]
TEXT_ORIGINS = ["", "copied from the prompt, its 3rd token (after a 2-token match)", "",
                "copied from the prompt, its 4th token, in a run from its 3rd (after a 2-token match)", "",
                "copied from this answer, its 9th token (after a 1-token match)",
                "copied from the prompt, its 5th token, in a run from its 3rd (after a 2-token match)"]  # versions 2, 3


def make_step(step: int, stopped: bool = False, adaptive: bool = False, hybrid: bool = False) -> StepEvent:
    """A 7-node tree: root -> {1, 4}; 1 -> {2, 5}; 2 -> {3}; 4 -> {7}. Accepted root-1-2, bonus 8 (or cut by a stop).

    `hybrid`: nodes 3, 5 and 6 were copied from the context (ranks k + j, k = 2), node 1 from both sources.
    """
    if hybrid:
        ev = make_step(step, stopped, adaptive=True)
        ev.ranks, ev.template = [-1, 0, 1, 2, 1, 2, 2], "hybrid"
        ev.sources, ev.origins = list(HYBRID_SOURCES), copy.deepcopy(HYBRID_ORIGINS)
        return ev
    return StepEvent(
        step=step, position=10 + 3 * step, tokens=[0, 1, 4, 2, 5, 7, 3], parents=[-1, 0, 0, 1, 1, 2, 3],
        depths=[0, 1, 1, 2, 2, 2, 3], ranks=[-1, 0, 1, 0, 1, 0, 0], accepted=[0, 1, 3],
        emitted=[1] if stopped else [1, 2, 8], bonus=None if stopped else 8, timings=dict(TIMINGS),
        matrix_rows=[0, 1, 2, 4], matrix_values=[[1, 4], [2, 5], [8, 3], [7, 9]],
        matrix_probs=[[0.7, 0.2], [0.6, 0.3], [0.9, 0.05], [0.5, 0.4]],
        node_probs=[1.0, 0.7, 0.2, 0.4, 0.2, 0.1, 0.3] if adaptive else None, template="adaptive" if adaptive else "tiny",
    )


def summary(tokens: list[int], method: str = "recycling") -> SummaryEvent:
    return SummaryEvent(tokens=tokens, prompt_tokens=5, new_tokens=len(tokens), steps=3, mean_accepted=7 / 3,
                        tokens_per_s=100.0, prefill_s=0.1, decode_s=0.06, wall_s=0.16, stop_reason="eos",
                        method=method, template="tiny", matrix_rows_filled=5, matrix_mb=0.1)


def valid_trace() -> Trace:
    trace = Trace(model="tiny", settings={"template": "tiny", "temperature": 0.0, "k": 2, "prompt_seeding": None,
                                          "plain": False},
                  messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi ✓"}])
    for ev in (make_step(0), make_step(1, hybrid=True), make_step(2, stopped=True)):
        trace.add_step(ev, text_of)
    trace.step_texts = [" the cat mat", " the cat mat", " the"]
    trace.summary = summary([1, 2, 8, 1, 2, 8, 1])
    trace.plain = summary([1, 2, 8, 1, 2, 8, 1], method="plain")
    return trace


def valid_dict() -> dict:
    return valid_trace().to_dict()


def draw_all(trace: Trace) -> None:
    """Everything the studio draws from a trace, for every step (raises on any inconsistency)."""
    tracker = MatrixTracker()
    for i, ev in enumerate(trace.steps):
        tracker.update(ev)
        for fig in (tree_figure(ev, trace.token_text), heatmap_figure(tracker, ev, trace.token_text),
                    accepted_chart(trace.steps, current=i)):
            fig.to_json()


# ----------------------------------------------------------------------------------------- valid traces


def test_valid_trace_round_trips_unchanged(tmp_path):
    trace = valid_trace()
    path = trace.save(tmp_path / "upload_trace.json")
    back = Trace.load(path)
    assert back.to_dict() == trace.to_dict()
    assert back.steps == trace.steps and back.summary == trace.summary and back.plain == trace.plain
    assert back.save(tmp_path / "again.json").read_bytes() == path.read_bytes()
    draw_all(back)


@pytest.mark.parametrize("template", ["2.2.2", "adaptive"])
def test_engine_traces_of_a_tiny_model_load(tmp_path, template):
    """Traces the real engine writes (static and adaptive trees, an answer cut by the length limit) still load."""
    from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), topk_candidates=8)
    cfg = DecodeConfig(max_new_tokens=40, template=template, hardware_aware=False, node_budget=24)
    trace = Trace(model="tiny", settings=dict(cfg.__dict__, k=8), messages=[{"role": "user", "content": "hi"}])
    for ev in engine.generate([5, 6, 7, 8, 5, 6, 7], cfg):
        if isinstance(ev, StepEvent):
            trace.add_step(ev, lambda t: f"t{t}")
        else:
            trace.summary = ev
    trace.step_texts = ["x"] * len(trace.steps)
    assert max(len(ev.tokens) for ev in trace.steps) > 1  # real draft trees
    back = Trace.load(trace.save(tmp_path / "engine.json"))
    assert back.to_dict() == trace.to_dict()
    draw_all(back)


def test_hybrid_engine_traces_keep_where_each_node_came_from(tmp_path):
    """A hybrid tree on a prompt that repeats itself drafts from the context; the trace keeps sources and origins."""
    from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), topk_candidates=8)
    rng = random.Random(0)
    prompt = [rng.randrange(2, TINY_VOCAB) for _ in range(12)] * 3
    cfg = DecodeConfig(max_new_tokens=40, template="hybrid-fixed")
    trace = Trace(model="tiny", settings=dict(cfg.__dict__, k=8), messages=[{"role": "user", "content": "hi"}])
    for ev in engine.generate(prompt, cfg):
        if isinstance(ev, StepEvent):
            trace.add_step(ev, lambda t: f"t{t}")
        else:
            trace.summary = ev
    trace.step_texts = ["x"] * len(trace.steps)
    retrieved = [(ev, i) for ev in trace.steps for i, s in enumerate(ev.sources or []) if s in ("context", "both")]
    assert retrieved, "a prompt that repeats itself must give context drafts"
    assert all(ev.origins[i]["where"] in PLACES for ev, i in retrieved)  # data: the views word it
    data = json.loads(trace.save(tmp_path / "hybrid.json").read_text(encoding="utf-8"))
    assert data["version"] == schema.TRACE_VERSION == 4
    back = Trace.load(tmp_path / "hybrid.json")
    assert back.to_dict() == trace.to_dict() and back.steps == trace.steps
    draw_all(back)


def test_hybrid_steps_round_trip(tmp_path):
    back = Trace.load(valid_trace().save(tmp_path / "upload_trace.json"))
    assert back.steps[1].sources == HYBRID_SOURCES and back.steps[1].origins == HYBRID_ORIGINS
    assert back.steps[0].sources is None and back.steps[0].origins is None


def version_1_dict() -> dict:
    """The valid trace as the studio wrote it before sources and origins existed."""
    data = valid_dict()
    data["version"] = 1
    for ev in data["steps"]:
        del ev["sources"], ev["origins"]
    return data


def test_version_1_traces_still_load(tmp_path):
    path = tmp_path / "old_trace.json"
    path.write_text(json.dumps(version_1_dict()), encoding="utf-8")
    back = Trace.load(path)
    assert len(back.steps) == 3 and all(ev.sources is None and ev.origins is None for ev in back.steps)
    draw_all(back)
    assert json.loads(back.save(tmp_path / "again.json").read_text(encoding="utf-8"))["version"] == 4  # saved as new


@pytest.mark.parametrize("version", [2, 3])
def test_text_origins_of_versions_2_and_3_are_checked_then_dropped(version):
    """Versions 2 and 3 wrote where a copied node was found as English text: read (and checked as text), not kept;
    the views phrase version 4's data."""
    data = valid_dict()
    data["version"] = version
    data["steps"][1]["origins"] = list(TEXT_ORIGINS)
    back = Trace.from_dict(copy.deepcopy(data))
    assert back.steps[1].origins is None and back.steps[1].sources == HYBRID_SOURCES
    draw_all(back)
    for bad, message in [("x" * 201, r"\"origins\"\[3\] must be a string of at most 200 characters, got \"x"),
                         (HYBRID_ORIGINS[3], r"\"origins\"\[3\] must be a string of at most 200 characters, got an "
                                             r"object")]:
        data["steps"][1]["origins"][3] = bad
        with pytest.raises(TraceError, match=message):
            Trace.from_dict(data)
    data = valid_dict()  # and version 4 reads no text
    data["steps"][1]["origins"] = list(TEXT_ORIGINS)
    with pytest.raises(TraceError, match=r"^step 1: \"origins\"\[0\] must be an object, got a string$"):
        Trace.from_dict(data)


def test_other_versions_are_refused_saying_which_are_read(tmp_path):
    for version in (5, 0, -1, 99):
        data = valid_dict()
        data["version"] = version
        expected = rf"^unsupported trace version {version} \(this app reads versions 1, 2, 3 and 4\)$"
        with pytest.raises(TraceError, match=expected):
            Trace.from_dict(data)
    data = version_1_dict()
    data["steps"][1]["origins"] = [""] * 7
    with pytest.raises(TraceError, match=r"^step 1: \"origins\" is new in trace version 2, but this trace says "
                                         r"version 1$"):
        Trace.from_dict(data)


ANY_SOURCE = r"must be \"matrix\", \"context\" or \"both\"$"
ORIGINS_DISAGREE = (r"^step 1: \"origins\" must say where each copied node was found \(\"first\" <= \"last\"\), and "
                    r"nothing else$")
A_SOURCE = r"must be \"root\", \"matrix\", \"context\" or \"both\", got "


@pytest.mark.parametrize("path, value, message", [
    ("steps/1/sources", ["root", "matrix"],
     r"^step 1: \"sources\" must be a list of 7 strings \(one per node\), got a list of 2$"),
    ("steps/1/sources", "matrix", r"^step 1: \"sources\" must be a list of 7 strings .*got a string$"),
    ("steps/1/sources/2", 5, r"^step 1: \"sources\"\[2\] " + A_SOURCE + "5$"),
    ("steps/1/sources/2", "prompt", r"^step 1: \"sources\"\[2\] " + A_SOURCE + r"\"prompt\"$"),
    ("steps/1/sources/0", "context", r"^step 1: source of node 0 is \"context\", must be \"root\"$"),
    ("steps/1/sources/5", "root", r"^step 1: source of node 5 is \"root\", " + ANY_SOURCE),
    ("steps/1/origins/3", "copied from the prompt", r"^step 1: \"origins\"\[3\] must be an object, got a string$"),
    ("steps/1/origins/3/where", "the prompt", r"^step 1: \"origins\"\[3\]: \"where\" must be \"context\", \"prompt\", "
                                              r"\"answer\", \"earlier_prompt\", \"earlier_answer\" or \"warm_start\", got "
                                              r"\"the prompt\"$"),
    ("steps/1/origins/3/match", 0, r"^step 1: \"origins\"\[3\]: \"match\" must be an integer from 1 to 1023, got 0$"),
    ("steps/1/origins/3", None, ORIGINS_DISAGREE),  # a copied node without an origin
    ("steps/1/origins/2", HYBRID_ORIGINS[3], ORIGINS_DISAGREE),  # a matrix node with one
    ("steps/1/origins/3/first", 4, ORIGINS_DISAGREE),  # a run starting after the token copied
    ("steps/1/sources", None, ORIGINS_DISAGREE),  # origins of nodes the step does not say were copied
    ("steps/1/ranks/3", 80, r"^step 1: \"ranks\"\[3\] must be an integer from -1 to 79, got 80$"),
])
def test_sources_and_origins_are_checked_with_clear_messages(path, value, message):
    data = valid_dict()
    setter(path, value)(data)
    with pytest.raises(TraceError, match=message):
        Trace.from_dict(data)


def test_context_children_may_rank_above_k():
    data = valid_dict()
    data["steps"][1]["ranks"][3] = schema.MAX_K + 3  # the 4th context-only child of a row of MAX_K candidates
    assert Trace.from_dict(data).steps[1].ranks[3] == schema.MAX_K + 3


def test_the_schema_knows_every_field_of_a_trace_and_its_defaults():
    """A field missing from a table would refuse every trace that has it; a wrong default would check the wrong value."""
    from dataclasses import MISSING, fields

    def defaults(cls) -> dict:
        return {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(cls)
                if f.default is not MISSING or f.default_factory is not MISSING}

    legacy = {"no_draft_reason"}  # read in version 2 traces, not kept (tests/test_warm.py)
    assert set(schema.STEP.fields) == {f.name for f in fields(StepEvent)} | legacy
    assert set(schema.SUMMARY.fields) == {f.name for f in fields(SummaryEvent)}
    assert set(schema.TRACE.fields) == {"format", "version"} | {f.name for f in fields(Trace)}
    assert schema.TRACE.defaults == defaults(Trace)
    assert schema.STEP.defaults == {**{k: v for k, v in defaults(StepEvent).items() if k != "kind"}, "no_draft_reason": None}


# ------------------------------------------------------------------------------------ mutations of a dict


def step0(d: dict) -> dict:
    return d["steps"][0]


def walk(d: dict, path: str) -> tuple:
    """The container and key that a '/'-separated path names (numbers index lists; dict keys stay strings)."""
    keys = path.split("/")
    target = d
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = keys[-1]
    return target, int(last) if isinstance(target, list) else last


def setter(path: str, value):
    """A mutation setting the value at a path."""
    def mutate(d: dict) -> None:
        target, key = walk(d, path)
        target[key] = copy.deepcopy(value)

    return mutate


def deleter(path: str):
    """A mutation deleting the key at a path."""
    def mutate(d: dict) -> None:
        target, key = walk(d, path)
        del target[key]

    return mutate


def nested(depth: int):
    """A list nested `depth` deep, built without recursion."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


MUTATIONS = {
    # tree shape
    "parent out of range": setter("steps/0/parents/5", 7),
    "parent >= own index": setter("steps/0/parents/1", 1),
    "parent far out of range": setter("steps/0/parents/3", 10**6),
    "negative parent": setter("steps/0/parents/2", -1),
    "root has a parent": setter("steps/0/parents/0", 0),
    "wrong depth": setter("steps/0/depths/3", 5),
    "root depth": setter("steps/0/depths/0", 1),
    "root rank": setter("steps/0/ranks/0", 0),
    "negative rank": setter("steps/0/ranks/2", -1),
    "rank too large": setter("steps/0/ranks/2", schema.MAX_RANK),
    "ragged tokens": lambda d: step0(d)["tokens"].pop(),
    "ragged parents": lambda d: step0(d)["parents"].append(0),
    "ragged depths": lambda d: step0(d)["depths"].pop(),
    "ragged ranks": lambda d: step0(d)["ranks"].append(0),
    "empty tree": lambda d: step0(d).update(tokens=[], parents=[], depths=[], ranks=[], accepted=[], emitted=[],
                                            bonus=None),
    "tree too large": lambda d: step0(d).update(tokens=[0] * 1025, parents=[-1] + list(range(1024)),
                                                depths=list(range(1025)), ranks=[-1] + [0] * 1024),
    # accepted path and emitted tokens
    "accepted empty": setter("steps/0/accepted", []),
    "accepted not from the root": setter("steps/0/accepted", [1, 3]),
    "accepted broken": setter("steps/0/accepted", [0, 2, 3]),
    "accepted out of range": setter("steps/0/accepted", [0, 1, 99]),
    "accepted negative": setter("steps/0/accepted", [0, -1]),
    "accepted repeats the root": setter("steps/0/accepted", [0, 0]),
    "emitted longer than the path": setter("steps/0/emitted", [1, 2, 8, 9]),
    "emitted not the accepted tokens": setter("steps/0/emitted", [1, 5, 8]),
    "bonus not emitted last": setter("steps/0/bonus", 9),
    "bonus missing": setter("steps/0/bonus", None),
    "bonus after a cut": setter("steps/2/bonus", 8),
    # types
    "str token": setter("steps/0/tokens/1", "1"),
    "bool token": setter("steps/0/tokens/1", True),
    "float token": setter("steps/0/tokens/1", 1.0),
    "negative token": setter("steps/0/tokens/1", -3),
    "token id too large": setter("steps/0/tokens/1", 2**31),
    "None tokens": setter("steps/0/tokens", None),
    "None parents": setter("steps/0/parents", None),
    "dict accepted": setter("steps/0/accepted", {"0": 0}),
    "bool step": setter("steps/0/step", True),
    "negative step": setter("steps/0/step", -1),
    "str position": setter("steps/0/position", "10"),
    "float bonus": setter("steps/0/bonus", 8.0),
    "bool bonus": setter("steps/0/bonus", True),
    "timings a list": setter("steps/0/timings", []),
    "str timing": setter("steps/0/timings/total", "10"),
    "NaN timing": setter("steps/0/timings/total", math.nan),
    "infinite timing": setter("steps/0/timings/forward", math.inf),
    "bool timing": setter("steps/0/timings/forward", False),
    "template not a string": setter("steps/0/template", 3),
    "step of another kind": setter("steps/0/kind", "summary"),
    "step without kind": deleter("steps/0/kind"),
    "step without emitted": deleter("steps/0/emitted"),
    "step not an object": setter("steps/0", [1, 2]),
    "steps not a list": setter("steps", {"0": {}}),
    "steps null": setter("steps", None),
    # matrix rows
    "matrix rows without values": lambda d: step0(d)["matrix_values"].pop(),
    "empty matrix row": setter("steps/0/matrix_values/0", []),
    "matrix row too wide": setter("steps/0/matrix_values/0", list(range(65))),
    "matrix value a string": setter("steps/0/matrix_values/1/0", "x"),
    "matrix values not a list": setter("steps/0/matrix_values", None),
    "probability above 1": setter("steps/0/matrix_probs/0/0", 1.5),
    "negative probability": setter("steps/0/matrix_probs/0/1", -0.1),
    "NaN probability": setter("steps/0/matrix_probs/0/0", math.nan),
    "short probability row": lambda d: step0(d)["matrix_probs"][0].pop(),
    "probability rows missing": lambda d: step0(d)["matrix_probs"].pop(),
    "more matrix rows than nodes": lambda d: step0(d).update(matrix_rows=[0] * 8, matrix_values=[[1]] * 8,
                                                             matrix_probs=[]),
    "node_probs too short": lambda d: d["steps"][1]["node_probs"].pop(),
    "node_probs a string": setter("steps/1/node_probs/2", "0.5"),
    "node_probs infinite": setter("steps/1/node_probs/2", math.inf),
    "node_probs an object": setter("steps/1/node_probs", {}),
    # where each node came from (version 2, hybrid trees)
    "sources too short": lambda d: d["steps"][1]["sources"].pop(),
    "sources too long": lambda d: d["steps"][1]["sources"].append("matrix"),
    "sources a string": setter("steps/1/sources", "matrix"),
    "sources an object": setter("steps/1/sources", {}),
    "source unknown": setter("steps/1/sources/2", "prompt"),
    "source not a string": setter("steps/1/sources/2", 1),
    "source null": setter("steps/1/sources/3", None),
    "root source not first": setter("steps/1/sources/0", "matrix"),
    "root source twice": setter("steps/1/sources/4", "root"),
    "root source missing": lambda d: step0(d).update(sources=["matrix"] * 7),
    "origins too short": lambda d: d["steps"][1]["origins"].pop(),
    "origins a string": setter("steps/1/origins", "copied"),
    "origin text": setter("steps/1/origins/1", "copied from the prompt"),
    "origin null for a copied node": setter("steps/1/origins/1", None),
    "origin a list": setter("steps/1/origins/1", ["prompt", 2, 2, 2]),
    "origin of a matrix node": setter("steps/1/origins/2", {"where": "prompt", "first": 0, "last": 0, "match": 1}),
    "origin of the root": setter("steps/1/origins/0", {"where": "prompt", "first": 0, "last": 0, "match": 1}),
    "origin somewhere unknown": setter("steps/1/origins/3/where", "a warm-start answer"),
    "origin missing a field": deleter("steps/1/origins/3/match"),
    "origin with an extra field": setter("steps/1/origins/3/text", "copied"),
    "origin negative first": setter("steps/1/origins/3/first", -1),
    "origin first after last": setter("steps/1/origins/3/last", 1),
    "origin bool last": setter("steps/1/origins/3/last", True),
    "origin float match": setter("steps/1/origins/3/match", 2.0),
    "origin match zero": setter("steps/1/origins/3/match", 0),
    "origins without sources": lambda d: step0(d).update(origins=[None] * 7),
    "sources in a version 1 trace": setter("version", 1),
    # header, messages, settings
    "no format": deleter("format"),
    "unknown version": setter("version", 5),
    "origins as data in a version 3 trace": setter("version", 3),
    "version 0": setter("version", 0),
    "string version": setter("version", "1"),
    "bool version": setter("version", True),
    "float version": setter("version", 1.0),
    "float version 2": setter("version", 2.0),
    "not an object": lambda d: d.clear(),
    "model not a string": setter("model", 5),
    "model too long": setter("model", "m" * 200_001),
    "bad role": setter("messages/0/role", "admin"),
    "content not a string": setter("messages/1/content", ["hi"]),
    "message with extra key": setter("messages/1/metadata", {"title": "x"}),
    "message a string": setter("messages/0", "hi"),
    "messages an object": setter("messages", {}),
    "setting a list": setter("settings/template", ["tiny"]),
    "setting NaN": setter("settings/temperature", math.nan),
    "settings a list": setter("settings", []),
    "settings nested too deep": setter("settings/template", nested(100)),
    # token table, step texts, summaries
    "token key not a number": setter("token_texts/abc", "x"),
    "token key negative": setter("token_texts/-1", "x"),
    "token key with a space": setter("token_texts/ 5", "x"),
    "token key too large": setter("token_texts/2147483648", "x"),
    "token text not a string": setter("token_texts/1", 1),
    "step texts ragged": lambda d: d["step_texts"].pop(),
    "step text not a string": setter("step_texts/0", None),
    "summary missing a field": deleter("summary/tokens_per_s"),
    "summary token a string": setter("summary/tokens/0", "a"),
    "summary infinite speed": setter("summary/tokens_per_s", math.inf),
    "summary negative count": setter("plain/steps", -1),
    "summary of another kind": setter("summary/kind", "step"),
    "summary a list": setter("summary", []),
    "plain empty": setter("plain", {}),
    "summary reason not a string": setter("summary/stop_reason", None),
    # fields a trace does not have
    "unknown top-level field": setter("extra", [[]] * 1000),
    "unknown step field": setter("steps/1/tokenz", [1]),
    "unknown summary field": setter("plain/speedup", 2.0),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_malformed_trace_is_a_trace_error(name):
    data = valid_dict()
    MUTATIONS[name](data)
    with pytest.raises(TraceError) as info:
        Trace.from_dict(data)
    message = str(info.value)
    assert message and len(message) < 300 and "\n" not in message


def test_messages_name_the_problem_and_place():
    data = valid_dict()
    data["steps"][0]["parents"][5] = 7
    with pytest.raises(TraceError, match=r"^step 0: parent of node 5 is 7, must be between 0 and 4$"):
        Trace.from_dict(data)
    data = valid_dict()
    data["messages"][1]["content"] = "bad \ud800"
    with pytest.raises(TraceError, match=r"messages\[1\]\.content.*lone surrogate"):
        Trace.from_dict(data)


def test_deeply_nested_object_in_memory_is_a_trace_error():
    data = valid_dict()
    data["settings"] = {"x": nested(100_000)}
    with pytest.raises(TraceError, match="nested"):
        Trace.from_dict(data)


def test_bounds_are_module_constants(monkeypatch):
    """The file's limits are tr_core.trace's, its fields' tr_core.trace_schema's."""
    for name, value in [("MAX_STEPS", 2), ("MAX_TOTAL_NODES", 13), ("MAX_TOTAL_MATRIX_VALUES", 15),
                        ("MAX_TOKEN_TEXT_CHARS", 20), ("MAX_TOTAL_CHARS", 50), ("MAX_TOKEN_TEXTS", 3),
                        ("MAX_MESSAGES", 1), ("MAX_SETTINGS", 1), ("MAX_STRING_CHARS", 10), ("MAX_TIMINGS", 2),
                        ("MAX_ANSWER_TOKENS", 6), ("MAX_RANK", 2), ("MAX_ORIGIN_MATCH", 1)]:
        Trace.from_dict(valid_dict())
        with monkeypatch.context() as m:
            m.setattr(trace_mod if name in ("MAX_TOTAL_CHARS", "MAX_STRING_CHARS") else schema, name, value)
            with pytest.raises(TraceError):
                Trace.from_dict(valid_dict())


# ----------------------------------------------------------------------------------------------- files


def load_error(path, **kw) -> str:
    with pytest.raises(TraceError) as info:
        Trace.load(path, **kw)
    message = str(info.value)
    assert str(path.parent) not in message and path.stem not in message  # never a file system path
    return message


def test_bad_files_are_trace_errors_without_paths(tmp_path):
    path = tmp_path / "secret_upload_name.json"
    for text in ["{", "", "not json at all", '{"format": "token-recycling-trace", "version": 1, "steps": [1,]}']:
        path.write_text(text, encoding="utf-8")
        assert "JSON" in load_error(path)
    path.write_bytes(b'{"model": "\xff\xfe"}')
    assert "UTF-8" in load_error(path)
    path.write_text('{"format": "token-recycling-trace", "version": 1, "model": ' + "1" * 5000 + "}")
    assert "JSON" in load_error(path)
    path.write_text(json.dumps({"format": "other"}))
    assert "not a Token Recycling trace" in load_error(path)
    assert "cannot read" in load_error(tmp_path / "secret_missing_file.json")
    assert "cannot read" in load_error(tmp_path)  # a folder


def test_deeply_nested_file_is_a_trace_error(tmp_path):
    path = tmp_path / "upload_nested.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested" in load_error(path)
    data = valid_dict()
    data["settings"]["x"] = nested(200)  # parsed by json, refused by the depth check
    path.write_text(json.dumps(data))
    assert "nested" in load_error(path)


def test_file_over_max_bytes_is_refused(tmp_path):
    path = valid_trace().save(tmp_path / "upload_trace.json")
    size = path.stat().st_size
    assert Trace.load(path, max_bytes=size).steps
    assert "too large" in load_error(path, max_bytes=size - 1)
    assert Trace.load.__defaults__ == (10 * 1024 * 1024,)


def test_lone_surrogates_are_refused(tmp_path):
    path = tmp_path / "upload_trace.json"
    text = json.dumps(valid_dict())  # ASCII, so "\ud800" below stays an escape the JSON parser turns into a surrogate
    for old, new in [('"content": "hi \\u2713"', '"content": "hi \\ud800"'),
                     ('"template": "tiny"', '"templ\\udfffate": "tiny"'),
                     ('"1": " the"', '"1": "\\udbff the"')]:
        assert old in text
        path.write_text(text.replace(old, new), encoding="utf-8")
        assert "surrogate" in load_error(path)


def test_nan_and_infinity_in_a_file_are_refused(tmp_path):
    path = tmp_path / "upload_trace.json"
    data = valid_dict()
    for value in ("NaN", "Infinity", "-Infinity", "1e999"):
        path.write_text(json.dumps(data).replace('"total": 10.7', f'"total": {value}', 1))
        assert "finite" in load_error(path)


def test_step_count_over_the_bound(monkeypatch, tmp_path):
    path = valid_trace().save(tmp_path / "upload_trace.json")
    monkeypatch.setattr(schema, "MAX_STEPS", 2)
    assert "steps" in load_error(path)


# -------------------------------------------------------------------------------------------------- fuzz


def leaves(obj, path=()):
    """(path, value) of every value of a JSON-like object, containers included."""
    out, stack = [], [(obj, path)]
    while stack:
        value, where = stack.pop()
        out.append((where, value))
        if isinstance(value, dict):
            stack.extend((v, where + (k,)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, where + (i,)) for i, v in enumerate(value))
    return out


ODD_VALUES = [None, True, False, 0, 1, -1, 2, 3, 6, 7, 2**31, -(2**40), 0.5, 1.5, -2.0, math.nan, math.inf, "", "x",
              "7", "\ud800", [], [0], [1, 2], [[1]], {}, {"a": 1}, {"kind": "step"}]


def mutate(data: dict, rng: random.Random) -> None:
    """One random change: a value replaced (odd value or nearby integer), a key deleted, a list cut or grown."""
    path, value = rng.choice(leaves(data)[1:])
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.45:
        parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif action < 0.65 and type(value) is int:
        parent[path[-1]] = value + rng.choice([-2, -1, 1, 2])
    elif action < 0.8 and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(value, list) and value:
        del value[rng.randrange(len(value)):]
    elif isinstance(value, list):
        value.append(rng.choice([0, 1, "x", None]))
    else:
        parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))


def test_random_mutations_give_a_trace_error_or_a_drawable_trace(tmp_path):
    rng = random.Random(20240611)
    accepted = refused = 0
    for _ in range(300):
        data = valid_dict()
        for _ in range(rng.choice([1, 1, 1, 2])):
            mutate(data, rng)
        try:
            trace = Trace.from_dict(data)
        except TraceError:
            refused += 1
            continue
        accepted += 1
        draw_all(trace)
        back = Trace.load(trace.save(tmp_path / "fuzz.json"))
        assert back.to_dict() == trace.to_dict()
    assert refused > 100 and accepted > 20, (accepted, refused)
