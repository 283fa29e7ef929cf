"""One step under the microscope (present/microscope.py): the rows a step read, the tree built from them, the
verdict, the rows written back before and after; recorded by the engine (`rows_read*`, `choices`), checked on trace
load."""
from __future__ import annotations

import copy
import json
import math
import re
from html.parser import HTMLParser

import pytest
import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from tr_core import DecodeConfig, Engine, StepEvent
from present.microscope import (BLOCK_TAGS, CSS, KnownRows, microscope_blocks, microscope_view,
                                       render_blocks, rows_before, step_microscope)
from tr_core.trace import Trace, TraceError

TEXTS = {3: "three", 5: "five", 7: "seven", 8: "<b>eight</b>", 9: "nine", 1: "one", 2: "two", 4: "four", 6: "six",
         0: "zero", 11: "eleven"}


def step0() -> StepEvent:
    """Root 5; row 5 gave nodes 1 (7, rank 0) and 2 (9, rank 1); row 7 gave node 3 (8, rank 0). The model chose 7
    after 5 and 3 after 7: path 5 -> 7, bonus 3, the draft's 8 rejected."""
    return StepEvent(step=0, position=10, tokens=[5, 7, 9, 8], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2],
                     ranks=[-1, 0, 1, 0], accepted=[0, 1], emitted=[7, 3], bonus=3, timings={},
                     rows_read=[5, 7], rows_read_values=[[7, 9, 2], [8, 4, 6]],
                     rows_read_probs=[[0.6, 0.2, 0.1], [0.5, 0.3, 0.1]],
                     matrix_rows=[5, 7, 9, 8], matrix_values=[[7, 1, 2], [3, 8, 4], [1, 2, 4], [6, 4, 2]],
                     matrix_probs=[[0.7, 0.1, 0.1], [0.4, 0.4, 0.1], [0.3, 0.3, 0.3], [0.5, 0.2, 0.2]],
                     choices=[7, 3, 1, 6])


PROMPT_START = {"where": "prompt", "first": 0, "last": 0, "match": 1}  # copied from the prompt's first token


def step1() -> StepEvent:
    """Root 3 (an empty row: drafts token 0), a token copied from the context; rewrites rows 3 and 5 (as before)."""
    return StepEvent(step=1, position=12, tokens=[3, 0, 11], parents=[-1, 0, 0], depths=[0, 1, 1],
                     ranks=[-1, 0, 3], accepted=[0, 2], emitted=[11, 5], bonus=5, timings={},
                     sources=["root", "matrix", "context"], origins=[None, None, PROMPT_START],
                     rows_read=[3], rows_read_values=[[0, 0, 0]], rows_read_probs=[[0.0, 0.0, 0.0]],
                     matrix_rows=[3, 5], matrix_values=[[11, 1, 2], [7, 1, 2]],
                     matrix_probs=[[0.9, 0.05, 0.01], [0.7, 0.1, 0.1]], choices=[11, 4, 5])


def hand_trace() -> Trace:
    return Trace(model="hand", steps=[step0(), step1()], token_texts=dict(TEXTS))


# ------------------------------------------------------------------------------------------- hand-built


def test_reads_say_which_row_gave_which_child():
    m = step_microscope(hand_trace(), 0)
    row5, row7 = m["reads"]
    assert (row5["row"], row7["row"]) == (5, 7) and row5["depths"] == [0] and row7["depths"] == [1]
    assert [(c["token"], c["prob"], c["nodes"], c["accepted"]) for c in row5["candidates"]] == [
        (7, 0.6, [1], True), (9, 0.2, [2], False), (2, 0.1, [], False)]
    assert [(c["token"], c["nodes"], c["accepted"]) for c in row7["candidates"]] == [
        (8, [3], False), (4, [], False), (6, [], False)]
    assert row5["on_path"] and row7["on_path"] and not row5["empty"] and m["copied"] == []


def test_the_verdict_names_the_path_the_bonus_and_the_first_disagreement():
    v = step_microscope(hand_trace(), 0)["verdict"]
    assert [p["token"] for p in v["path"]] == [5, 7] and v["bonus"]["token"] == 3 and v["emitted"] == 2
    assert [(n["choice"], n["agrees"], n["accepted"]) for n in v["nodes"]] == [
        (7, None, True), (3, True, True), (1, False, False), (6, False, False)]
    d = v["disagreement"]
    assert d["node"] == 1 and [o["token"] for o in d["offered"]] == [8] and d["choice"] == 3


def test_a_path_cut_by_the_end_of_the_answer_says_how_many_accepted_tokens_it_kept():
    # the answer's length limit (or a stop token) after the first of two accepted drafts: both ✓, one kept, no bonus
    ev = StepEvent(step=0, position=10, tokens=[5, 7, 8], parents=[-1, 0, 1], depths=[0, 1, 2], ranks=[-1, 0, 0],
                   accepted=[0, 1, 2], emitted=[7], bonus=None, timings={}, matrix_rows=[5, 7, 8],
                   matrix_values=[[7], [8], [1]], matrix_probs=[[0.7], [0.6], [0.5]])
    blocks = json.dumps(microscope_blocks(step_microscope(Trace(model="hand", steps=[ev], token_texts=TEXTS), 0)))
    assert ("The answer ended inside this step (a stop token or the length limit), after 1 of its 2 accepted "
            "tokens: no bonus token. 1 token from one forward.") in blocks
    whole = StepEvent(**{**ev.__dict__, "emitted": [7, 8]})  # cut right at the path's end: nothing left out
    blocks = json.dumps(microscope_blocks(step_microscope(Trace(model="hand", steps=[whole], token_texts=TEXTS), 0)))
    assert "(a stop token or the length limit): no bonus token. 2 tokens from one forward." in blocks
    assert "not kept" not in blocks


def test_the_verdict_marks_the_drafts_past_the_answers_end_and_names_what_ended_it():
    """A cold reader saw a dropped draft with the kept ones' ✓, and "(a stop token or the length limit)" beside a
    status line that said the limit ended the answer."""
    from tr_core.events import SummaryEvent

    ev = StepEvent(step=0, position=10, tokens=[5, 7, 8], parents=[-1, 0, 1], depths=[0, 1, 2], ranks=[-1, 0, 0],
                   accepted=[0, 1, 2], emitted=[7], bonus=None, timings={}, matrix_rows=[5, 7, 8],
                   matrix_values=[[7], [8], [1]], matrix_probs=[[0.7], [0.6], [0.5]])
    trace = Trace(model="hand", steps=[ev], token_texts=TEXTS)
    m = step_microscope(trace, 0)
    text = json.dumps(microscope_blocks(m), ensure_ascii=False)
    cells = [b for b in text.split("{") if "trm-past" in b or "trm-ok" in b]
    assert len(cells) == 2 and "trm-ok" in cells[0] and "trm-past" in cells[1] and "✓ not kept" in cells[1]
    for reason, words in (("length", "the length limit"), ("eos", "an end-of-turn token")):
        trace.summary = SummaryEvent(tokens=[7], prompt_tokens=3, new_tokens=1, steps=1, mean_accepted=1.0,
                                     tokens_per_s=1.0, prefill_s=0.1, decode_s=0.1, wall_s=0.2, stop_reason=reason,
                                     method="recycling", template="hand", matrix_rows_filled=3, matrix_mb=0.1)
        blocks = json.dumps(microscope_blocks(step_microscope(trace, 0)))
        assert f"The answer ended inside this step ({words}), after 1 of its 2 accepted tokens" in blocks


def test_writes_before_and_after_exact_from_the_rows_read_and_the_earlier_steps():
    trace = hand_trace()
    w = {x["row"]: x for x in step_microscope(trace, 0)["writes"]}
    assert [c["token"] for c in w[5]["before"]] == [7, 9, 2] and [c["token"] for c in w[5]["after"]] == [7, 1, 2]
    assert w[5]["status"] == "changed" and [c["new"] for c in w[5]["after"]] == [False, True, False]
    assert [c["prob"] for c in w[5]["before"]] == [0.6, 0.2, 0.1]  # as read: stored before the step
    assert w[7]["status"] == "changed" and [c["new"] for c in w[7]["after"]] == [True, False, False]
    assert w[9]["status"] == w[8]["status"] == "unknown" and w[9]["before"] is None
    w1 = {x["row"]: x for x in step_microscope(trace, 1)["writes"]}
    # row 5 was not read by step 2: its before is what step 1 wrote
    assert [c["token"] for c in w1[5]["before"]] == [7, 1, 2] and w1[5]["status"] == "same"
    assert w1[5]["before_from"] == "written by step 1" and w1[3]["status"] == "new"  # row 3 was read empty
    assert rows_before(trace, 1) == {5: [7, 1, 2], 7: [3, 8, 4], 9: [1, 2, 4], 8: [6, 4, 2]}  # empty row 3: unknown


def test_empty_rows_and_context_copies_are_labelled_and_a_new_answer_forgets_the_rows():
    m = step_microscope(hand_trace(), 1)
    (row3,) = m["reads"]
    assert row3["empty"] and [c["prob"] for c in row3["candidates"]] == [None] * 3
    assert row3["candidates"][0]["nodes"] == [1]  # the empty row drafted token 0 at rank 0
    assert all(c["nodes"] == [] for c in row3["candidates"][1:])  # the copied node (rank 3) is no candidate
    (copied,) = m["copied"]
    assert (copied["node"], copied["token"], copied["origin"], copied["accepted"]) == (2, 11, PROMPT_START, True)
    assert copied["origin_text"] == "copied from the prompt, its 1st token (after a 1-token match)"
    later = hand_trace()
    later.steps[1].answer = 1  # a new answer: its prompt seeding may have rewritten any row
    assert {w["row"]: w["status"] for w in step_microscope(later, 1)["writes"]}[5] == "unknown"


def test_older_traces_without_reads_or_choices_still_explain_what_they_can():
    trace = hand_trace()
    for ev in trace.steps:
        ev.rows_read, ev.rows_read_values, ev.rows_read_probs, ev.choices = [], [], [], []
    m = step_microscope(trace, 0)
    assert not m["recorded"] and m["reads"] == []
    assert [n["choice"] for n in m["verdict"]["nodes"]] == [7, 3, None, None]  # the accepted path's, known
    assert m["verdict"]["disagreement"]["choice"] == 3
    assert "did not record" in microscope_view(trace, 0)
    with pytest.raises(IndexError):
        step_microscope(trace, 2)


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_view_is_escaped_text_in_known_tags_and_readable_in_a_hall():
    trace = hand_trace()
    trace.token_texts[9] = '<img src=x onerror="alert(1)">'
    page = microscope_view(trace, 0)
    parser = Tags()
    parser.feed(page)
    assert set(parser.tags) <= {"style", *BLOCK_TAGS} and "img" not in parser.tags
    text = "".join(parser.text)
    assert "<b>eight" in text and "<img␣src=x" in text  # shown as text (␣: a space, as the figures show it)
    assert "Step 1 under the microscope" in text and "2 rows of the adjacency matrix" in text
    # a row read may have been written by a step where its token was only drafted: the note says every tree token's is
    assert "Every step rewrites the row of each token in its tree, drafted or accepted" in text  # behind a fold
    assert "First disagreement after 'seven': the draft offered '<b>eight</b>'; the model chose 'three'" in text
    sizes = [int(x) for x in re.findall(r"font-size:\s*(\d+)px", CSS)]
    assert sizes and min(sizes) >= 16 and not re.search(r"font-size:\s*[\d.]+(rem|em|%)", CSS)
    assert microscope_view(trace, 99) == microscope_view(trace, 1)  # clamped to the last step
    assert "No step" in microscope_view(Trace(), 0)


def test_render_refuses_unknown_tags():
    assert render_blocks({"t": "script", "c": "x", "x": "alert(1)"}) == '<div class="x">alert(1)</div>'
    assert render_blocks({"t": "span", "c": '"><b', "x": "<i>"}) == '<span class="&quot;&gt;&lt;b">&lt;i&gt;</span>'


# ------------------------------------------------------------------------------------------- trace load


def _dict(trace: Trace) -> dict:
    return json.loads(json.dumps(trace.to_dict()))


def test_reads_survive_a_trace_file():
    back = Trace.from_dict(_dict(hand_trace()))
    assert back.steps[0].rows_read_values == [[7, 9, 2], [8, 4, 6]] and back.steps[1].choices == [11, 4, 5]
    assert step_microscope(back, 1) == step_microscope(hand_trace(), 1)


HOSTILE = {
    "rows_read not a list": ("rows_read", "5"),
    "negative row": ("rows_read", [-1, 7]),
    "row not a token of the tree": ("rows_read", [5, 42]),
    "row read twice": ("rows_read", [5, 5]),
    "boolean row": ("rows_read", [True, 7]),
    "huge row": ("rows_read", [2**70, 7]),
    "values missing": ("rows_read_values", [[7, 9, 2]]),
    "values of two widths": ("rows_read_values", [[7, 9, 2], [8, 4]]),
    "value not an id": ("rows_read_values", [[7, 9, "2"], [8, 4, 6]]),
    "too many candidates": ("rows_read_values", [list(range(65)), list(range(65))]),
    "probability above 1": ("rows_read_probs", [[0.6, 0.2, 1.5], [0.5, 0.3, 0.1]]),
    "NaN probability": ("rows_read_probs", [[math.nan, 0.2, 0.1], [0.5, 0.3, 0.1]]),
    "short probability row": ("rows_read_probs", [[0.6, 0.2], [0.5, 0.3, 0.1]]),
    "probabilities not a list": ("rows_read_probs", {"a": 1}),
    "choices of the wrong length": ("choices", [7, 3]),
    "choices null": ("choices", None),
    "negative choice": ("choices", [7, 3, -1, 6]),
}


HOSTILE_BEFORE = {  # step 0 writes rows 5, 7, 9, 8 and reads 5 and 7
    "a row not written": ("rows_before", [9, 3]),
    "a row also read": ("rows_before", [9, 5]),
    "values missing": ("rows_before_values", [[1, 2, 4]]),
    "another k than the rows read": ("rows_before_values", [[1, 2], [6, 4]]),
    "probability below 0": ("rows_before_probs", [[0.1, -0.2, 0.1], [0.5, 0.3, 0.1]]),
}


def with_leaves_recorded(data: dict) -> dict:
    """A trace dict whose step 0 also records its leaves' rows (9 and 8) as they were before it."""
    data["steps"][0].update(rows_before=[9, 8], rows_before_values=[[1, 2, 4], [6, 4, 0]],
                            rows_before_probs=[[0.3, 0.3, 0.3], [0.5, 0.2, 0.0]])
    return data


def test_rows_written_without_being_read_have_their_before_too():
    trace = Trace.from_dict(with_leaves_recorded(_dict(hand_trace())))
    w = {x["row"]: x for x in step_microscope(trace, 0)["writes"]}
    assert w[9]["status"] == "same" and w[9]["before_from"] == "as it was before this step"
    assert w[8]["status"] == "changed" and [c["new"] for c in w[8]["after"]] == [False, False, True]
    assert [c["prob"] for c in w[8]["before"]] == [0.5, 0.2, 0.0]


@pytest.mark.parametrize("name", list(HOSTILE_BEFORE))
def test_hostile_befores_are_refused_on_load(name):
    key, value = HOSTILE_BEFORE[name]
    data = with_leaves_recorded(_dict(hand_trace()))
    Trace.from_dict(copy.deepcopy(data))  # as recorded: loads
    data["steps"][0][key] = value
    with pytest.raises(TraceError) as err:
        Trace.from_dict(data)
    assert "step 0" in str(err.value)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_reads_are_refused_on_load(name):
    key, value = HOSTILE[name]
    data = _dict(hand_trace())
    data["steps"][0][key] = value
    with pytest.raises(TraceError) as err:
        Trace.from_dict(copy.deepcopy(data))
    assert "step 0" in str(err.value)


# ------------------------------------------------------------------------------------------- a real answer


def _answer(engine: Engine, prompt: list[int], template: str) -> list[tuple[StepEvent, dict]]:
    """(event, matrix just before its step) for every step after an answer's first (whose draft follows the prompt's
    seeding inside the engine); the matrix copy is taken between steps, where the engine is suspended."""
    out, before = [], None
    for ev in engine.generate(prompt, DecodeConfig(template=template, max_new_tokens=40, provenance=True)):
        if isinstance(ev, StepEvent):
            if before is not None:
                out.append((ev, before))
            before = {"table": engine.matrix.table.clone(), "probs": engine.matrix.probs.clone()}
    return out


@pytest.mark.parametrize("template", ["2.2.2", "adaptive-fixed", "hybrid-fixed", "hybrid"])
def test_recorded_reads_equal_the_matrix_before_the_step(template):
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    pairs = [p for prompt in ([5, 9, 14, 22, 9, 14, 30, 31], [5, 9, 14, 40, 41, 9, 14])
             for p in _answer(engine, prompt, template)]
    trace = Trace(steps=[ev for ev, _ in pairs])
    read = unread = 0
    for i, (ev, before) in enumerate(pairs):
        rows = torch.tensor(ev.rows_read, dtype=torch.long)
        assert ev.rows_read_values == before["table"][rows].tolist()
        assert ev.rows_read_probs == [[round(q / 255, 4) for q in r] for r in before["probs"][rows].tolist()]
        m = step_microscope(trace, i)
        for r in m["reads"]:  # every matrix node is its parent row's candidate at its rank, as read
            for c in r["candidates"]:
                assert all(ev.tokens[n] == c["token"] and ev.ranks[n] == c["rank"] for n in c["nodes"])
        matrix_nodes = [n for n in range(1, len(ev.tokens)) if not ev.sources or ev.sources[n] != "context"]
        assert sorted(n for r in m["reads"] for c in r["candidates"] for n in c["nodes"]) == matrix_nodes
        rows = torch.tensor(ev.rows_before, dtype=torch.long)  # the rows written but not read, as they were
        assert ev.rows_before_values == before["table"][rows].tolist()
        assert ev.rows_before_probs == [[round(q / 255, 4) for q in r] for r in before["probs"][rows].tolist()]
        assert set(ev.rows_read) | set(ev.rows_before) >= set(ev.matrix_rows)  # every row written: its before
        for w in m["writes"]:  # ... and so the microscope knows it: the matrix's
            assert w["status"] != "unknown" and w["before"] is not None, w
            assert [c["token"] for c in w["before"]] == before["table"][w["row"]].tolist()
        read += len(ev.rows_read)
        unread += len(ev.rows_before)
    assert read > 20 or template == "hybrid", "the check must cover many rows read"
    assert unread > 20, "... and many rows written without being read"


def test_choices_and_stored_probabilities_agree_with_the_path_and_the_matrix():
    engine = Engine(tiny_model("qwen2"), TinyTokenizer(TINY_VOCAB))
    cfg = DecodeConfig(template="2.2.2", max_new_tokens=30, provenance=True)
    for ev in engine.generate([5, 9, 14, 22, 9, 14, 30, 31], cfg):
        if not isinstance(ev, StepEvent):
            continue
        assert len(ev.choices) == len(ev.tokens)
        path = ev.accepted
        assert [ev.choices[a] for a in path[:-1]] == [ev.tokens[b] for b in path[1:]]
        if ev.bonus is not None:
            assert ev.choices[path[-1]] == ev.bonus
        for row, probs in zip(ev.matrix_rows, ev.matrix_probs):  # as the matrix stores them, after the step
            assert probs == [round(q / 255, 4) for q in engine.matrix.probs[row].tolist()]


def test_blocks_are_plain_data():
    blocks = microscope_blocks(step_microscope(hand_trace(), 0))
    assert json.loads(json.dumps(blocks)) == blocks
    assert KnownRows().before(step0())[5][2] == "read by this step"


def test_written_back_counts_are_singular_for_one_row():
    blocks = json.dumps(microscope_blocks(step_microscope(hand_trace(), 1)))  # rewrites row 3 (new) and row 5 (same)
    assert "0 rows changed, 1 row new (empty before), 1 row with the same" in blocks
    assert "earlier candidates this trace does not hold" not in blocks  # both rows' befores are known
    older = json.dumps(microscope_blocks(step_microscope(hand_trace(), 0)))  # rows 8 and 9: written, never read
    assert "2 rows whose earlier candidates this trace does not hold" in older
    assert "Written back: 2 rows, each from" in blocks


def test_a_run_of_copied_drafts_is_one_box_and_a_stray_copy_its_own():
    """Issue 55: fourteen near-identical boxes for one copied run read as a wall; a run of RUN_MIN or more copied
    drafts (each the child of the one before, from the next token of one place) is one box saying where from and
    how many were accepted; a copy from elsewhere keeps a box of its own."""
    from present.microscope import copy_runs

    run = [{"where": "answer", "first": 83, "last": 83 + i, "match": 2} for i in range(5)]
    other = {"where": "prompt", "first": 2, "last": 2, "match": 1}
    ev = StepEvent(step=0, position=10, tokens=[5, 7, 9, 1, 2, 4, 6], parents=[-1, 0, 1, 2, 3, 4, 0],
                   depths=[0, 1, 2, 3, 4, 5, 1], ranks=[-1, -1, -1, -1, -1, -1, -1], accepted=[0, 1, 2, 3],
                   emitted=[7, 9, 1, 8], bonus=8, timings={}, sources=["root"] + ["context"] * 6,
                   origins=[None] + run + [other], rows_read=[5], rows_read_values=[[0, 0, 0]],
                   rows_read_probs=[[0.0, 0.0, 0.0]], matrix_rows=[5], matrix_values=[[7, 1, 2]],
                   matrix_probs=[[0.7, 0.1, 0.1]], choices=[7, 9, 1, 8, 0, 0, 0])
    trace = Trace(model="hand", steps=[ev], token_texts=dict(TEXTS))
    m = step_microscope(trace, 0)
    assert [len(r) for r in copy_runs(m["copied"])] == [5, 1]
    text = re.sub(r"<[^>]+>", " ", microscope_view(trace, 0))
    assert "'seven' … 'four' after 'five': 5 copied in one run from this answer's tokens 84-88, 3 accepted" in text
    assert "'six' after 'five' (copied from the prompt, its 3rd token (after a 1-token match))" in text
    assert text.count("copied in one run") == 1


def test_a_candidate_seeded_from_the_prompt_says_so_instead_of_a_flat_fifty_percent():
    """Issue 55: rows written from the prompt all read '50%', which looked like a placeholder. A drafted candidate
    that the answer's prompt seeding put in its row (StepEvent.written: step -1) is marked 'prompt', without the
    prior's percentage; one the model scored keeps its stored probability."""
    ev = step0()
    ev.rows_read_probs = [[0.502, 0.2, 0.1], [0.5, 0.3, 0.1]]
    ev.written = [[-1, -1], [0, -1], [0, 3], [0, 2]]  # node 1 (7 after 5): seeded by answer 0's prompt
    trace = Trace(model="hand", steps=[ev], token_texts=dict(TEXTS))
    row5 = step_microscope(trace, 0)["reads"][0]
    assert [c["seeded"] for c in row5["candidates"]] == [True, False, False]
    cells = re.findall(r'<span class="trm-cell[^"]*">([^<]*)</span>', render_blocks(microscope_blocks(
        step_microscope(trace, 0))))
    assert "seven prompt ✓" in cells and "nine 20%" in cells and not any("50%" in c for c in cells[:3]), cells
