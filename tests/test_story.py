"""The step story, on hand-built step events (no model needed)."""
from __future__ import annotations

import json

from tr_core.events import StepEvent
from present.heatmap import MatrixTracker
from present.story import quoted, step_story

VOCAB = {0: "<root>", 1: " the", 2: " cat", 3: " sat", 4: " dog", 5: "the", 6: "\n", 7: " on", 8: " mat", 9: "!"}


def text_of(t: int) -> str:
    return VOCAB.get(t, f"<{t}>")


def make_event(step: int = 0, **over) -> StepEvent:
    """A 7-node tree: root -> {1, 4}; 1 -> {2, 5}; 2 -> {3}; 4 -> {7}. Accepted root-1-2, bonus 8."""
    fields = dict(
        step=step, position=10 + step, tokens=[0, 1, 4, 2, 5, 7, 3], parents=[-1, 0, 0, 1, 1, 2, 3],
        depths=[0, 1, 1, 2, 2, 2, 3], ranks=[-1, 0, 1, 0, 1, 0, 0], accepted=[0, 1, 3], emitted=[1, 2, 8], bonus=8,
        timings={"total": 10.7}, matrix_rows=[0, 1, 2, 4], matrix_values=[[1, 4], [2, 5], [8, 3], [7, 9]],
        matrix_probs=[[0.7, 0.2], [0.6, 0.3], [0.9, 0.05], [0.5, 0.4]], template="tiny")
    fields.update(over)
    return StepEvent(**fields)


def sentences(story: str) -> int:
    return story.count(". ") + story.endswith(".")


def test_story_of_a_drafted_step_says_draft_rows_agreement_bonus_and_write_back():
    story = step_story(make_event(4), text_of)
    # 6 draft tokens; their parents' tokens (the rows they were read from): <root>, ␣the, ␣dog, ␣cat -> 4 rows
    assert story.startswith("Step 5 drafted 6 tokens after '<root>', read from 4 rows of the adjacency matrix.")
    assert "The model agreed with 2 ('␣the', '␣cat') and added the bonus token '␣mat': 3 tokens from one forward pass." in story
    assert "It wrote 4 rows of the matrix back" in story and "the row of '<root>' now starts with '␣the'." in story
    assert "context" not in story and "<b>" not in story and "&" not in story  # plain text, not HTML
    assert sentences(story) == 3


PROMPT_RUN = {"where": "prompt", "first": 2, "last": 2, "match": 2}  # a token copied from the prompt (origins)


def test_story_counts_distinct_rows_and_context_copies():
    # nodes 2 and 4 copied from the context (2 alone, 4 also in the matrix): node 2's parent row is not read
    ev = make_event(sources=["root", "matrix", "context", "matrix", "both", "matrix", "matrix"],
                    origins=[None, None, PROMPT_RUN, None, PROMPT_RUN, None, None])
    story = step_story(ev, text_of)
    # the 4 rows are those of the matrix-only drafts: the row a draft found in both was read too, but is not counted
    assert ("drafted 6 tokens after '<root>': 4 read from the adjacency matrix alone (4 rows), 1 copied from the "
            "conversation and 1 found both in a matrix row and in the conversation.") in story
    # the microscope lists every row read, also those only a "both" node came from: the story says how many of them
    ev.rows_read, ev.rows_read_values = [0, 1, 4, 2, 5], [[1, 4]] * 5
    assert "4 read from the adjacency matrix alone (4 of the 5 rows it read)" in step_story(ev, text_of)
    ev.rows_read, ev.rows_read_values = [], []
    only_context = make_event(tokens=[0, 1], parents=[-1, 0], depths=[0, 1], ranks=[-1, 8], accepted=[0, 1],
                              emitted=[1, 2], bonus=2, sources=["root", "context"], origins=[None, PROMPT_RUN])
    assert "drafted 1 token after '<root>', all copied from the conversation." in step_story(only_context, text_of)
    from tr_core.context import LIBRARY
    from present.microscope import microscope_blocks, step_microscope
    from tr_core.trace import Trace

    shipped = {"where": LIBRARY, "first": 2, "last": 2, "match": 2}  # from the warm start's answers
    ev.origins[2] = shipped
    assert ("1 copied from the sample answers learned beforehand and 1 found both in a matrix row and in the conversation"
            in step_story(ev, text_of))
    ev.origins[4] = shipped
    assert "1 found both in a matrix row and in the sample answers learned beforehand" in step_story(ev, text_of)
    only_context.origins[1] = shipped
    assert "all copied from the sample answers learned beforehand." in step_story(only_context, text_of)
    blocks = json.dumps(microscope_blocks(step_microscope(Trace(steps=[ev]), 0)))
    assert "2 drafted from the sample answers learned beforehand" in blocks
    assert "copied from a sample answer learned beforehand, its 3rd token (after a 2-token match)" in blocks


def test_story_of_a_rejected_draft_a_plain_step_and_a_stop():
    none = step_story(make_event(accepted=[0], emitted=[7], bonus=7), text_of)
    assert "The model agreed with none of them; its own next token '␣on' is the bonus" in none
    plain = step_story(make_event(tokens=[5], parents=[-1], depths=[0], ranks=[-1], accepted=[0], emitted=[6], bonus=6,
                                  matrix_rows=[5], matrix_values=[[6, 1]], matrix_probs=[[0.8, 0.1]]), text_of)
    assert plain.startswith("Plain step: nothing was drafted, so the forward gave one token, the model's own '↵'.")
    assert "It wrote 1 row of the matrix" in plain and "the row of 'the' now starts with '↵'" in plain
    assert sentences(plain) == 2
    why = make_event(tokens=[5], parents=[-1], depths=[0], ranks=[-1], accepted=[0], emitted=[6], bonus=6)
    why.no_draft = {"why": "cost", "drafts": 2, "gain": 0.31, "cost_ratio": 1.62, "context": False}
    assert step_story(why, text_of).startswith(
        "Plain step: nothing was drafted (no draft: the best tree (2 tokens) would add 0.31 accepted tokens on "
        "average, which would not pay for its forward (1.62× a one-token step on this machine)), so ")
    # cut by a stop token inside the accepted path: no bonus
    stop = step_story(make_event(emitted=[1], bonus=None), text_of)
    assert "The model agreed with 2 ('␣the', '␣cat'); the answer ended after 1 of them, at '␣the'" in stop
    assert "no bonus token" in stop and "bonus token '" not in stop
    assert "at '␣the' (a stop token or the length limit)" in stop  # the reason unknown (no summary yet)
    for reason, words in (("length", "the length limit"), ("eos", "an end-of-turn token")):
        named = step_story(make_event(emitted=[1], bonus=None), text_of, ended=reason)
        assert f"at '␣the' ({words}), so there is no bonus token." in named
    nothing = step_story(make_event(matrix_rows=[], matrix_values=[], matrix_probs=[]), text_of)
    assert nothing.endswith("It wrote nothing back into the adjacency matrix.")


def test_story_compares_rewritten_rows_with_the_matrix_before_the_step():
    first, second = make_event(0), make_event(1, matrix_values=[[4, 1], [2, 5], [8, 3], [7, 9]])
    second.matrix_rows, second.matrix_values = [0, 1, 2, 9], [[4, 1], [2, 5], [8, 3], [1, 2]]
    second.matrix_probs = [[0.5, 0.5]] * 4
    tracker, other = MatrixTracker(), MatrixTracker()
    before_first = tracker.update(first)
    assert before_first == {}
    assert "(4 rows new); the row of '<root>' now starts with '␣the'." in step_story(first, text_of, before_first)
    other.update(first)
    before = tracker.update(second)
    assert before == {0: [1, 4], 1: [2, 5], 2: [8, 3]}  # row 9 is new
    story = step_story(second, text_of, before)
    assert "(1 row new); the row of '<root>' now starts with '␣dog' (it started with '␣the' before)." in story
    same = make_event(2)
    assert "now starts with '␣the' (as before)" in step_story(same, text_of, other.update(same))


def test_story_quotes_long_lists_and_odd_tokens_as_text():
    long_path = make_event(tokens=list(range(10)), parents=[-1, 0, 1, 2, 3, 4, 5, 6, 7, 8], depths=list(range(10)),
                           ranks=[-1] + [0] * 9, accepted=list(range(10)), emitted=list(range(1, 10)) + [1], bonus=1)
    story = step_story(long_path, text_of)
    assert "The model agreed with 9 ('␣the', '␣cat', '␣sat', '␣dog', 'the', '↵' and 3 more)" in story
    assert "10 tokens from one forward" in story
    hostile = {0: "<img src=x onerror=alert(1)>", 1: "<script>x</script>", 8: "a & b"}
    odd = step_story(make_event(), lambda t: hostile.get(t, text_of(t)))
    assert "'<img␣src=x␣…'" in odd and "'<script>x</…'" in odd and "'a␣&␣b'" in odd  # raw text: the caller escapes
    assert quoted("") == "'∅'" and quoted(" \t") == "'␣⇥'"


def test_story_says_which_steps_wrote_the_rows_it_read():
    # node -> [answer, step] that wrote its candidate into its parent's row; this is answer 1 (the second)
    written = [[-1, -1], [1, 2], [1, 2], [1, -1], [1, -1], [0, 7], [1, 4]]
    story = step_story(make_event(9, answer=1, written=written), text_of)
    assert "read from 4 rows of the adjacency matrix (written by steps 3 and 5, the prompt and an earlier answer)." in story
    one = step_story(make_event(answer=0, written=[[-1, -1]] + [[0, 0]] * 6), text_of)
    assert "(written by step 1)." in one
    many = step_story(make_event(answer=0, written=[[-1, -1]] + [[0, s] for s in (1, 3, 5, 7, 9, 11)]), text_of)
    assert "(written by 6 earlier steps, from step 2 to 12)" not in many  # 6 stamps: still listed one by one
    assert "(written by steps 2, 4, 6, 8, 10 and 12)" in many
    chain = make_event(tokens=list(range(9)), parents=[-1, 0, 1, 2, 3, 4, 5, 6, 7], depths=list(range(9)),
                       ranks=[-1] + [0] * 8, accepted=[0], emitted=[1], bonus=1,
                       written=[[-1, -1]] + [[0, s] for s in range(8)])  # 8 rows, each written at its own step
    assert "read from 8 rows of the adjacency matrix (written by 8 earlier steps, from step 1 to 8)" in step_story(
        chain, text_of)
    unknown = step_story(make_event(written=[[-1, -1]] * 7), text_of)  # a loaded matrix: nothing to say
    assert "written by" not in unknown and "(written" not in step_story(make_event(), text_of)


def test_a_row_the_step_read_is_not_counted_new_as_in_the_microscope():
    # rows 0 (read, holding candidates) and 4 (read, empty: never written) are read; none is known from earlier steps
    ev = make_event(rows_read=[0, 4], rows_read_values=[[1, 4], [0, 0]], rows_read_probs=[[0.5, 0.2], [0.0, 0.0]])
    story = step_story(ev, text_of, matrix_before={})
    assert "It wrote 4 rows of the matrix back from this forward's candidates (3 rows new)" in story  # 1, 2 and 4
    assert "the row of '<root>' now starts with '␣the' (as before)" in story  # row 0 started with '␣the' when read


def test_a_token_drafted_twice_is_said_to_share_one_row():
    """25 tokens verified and 23 rows written read as two rows lost, unless the story says why."""
    from tr_core.events import StepEvent
    from present.story import step_story

    ev = StepEvent(step=0, position=5, tokens=[0, 1, 2, 1], parents=[-1, 0, 0, 2], depths=[0, 1, 1, 2],
                   ranks=[-1, 0, 1, 0], accepted=[0, 2, 3], emitted=[2, 1, 4], bonus=4, timings={"total": 1.0},
                   matrix_rows=[0, 1, 2], matrix_values=[[1], [4], [1]], matrix_probs=[[0.5], [0.5], [0.5]])
    story = step_story(ev, lambda t: f"w{t}", {})
    assert "It wrote 3 rows of the matrix back from this forward's candidates (one per distinct token of its 4, 3 rows new)" in story
    assert "candidates (one per distinct token of its 4); the row of" in step_story(ev, lambda t: f"w{t}", None)


def test_the_brief_story_keeps_the_step_and_drops_the_details_the_microscope_has():
    """The presentation view's story: the same step, what the model agreed with and the row it rewrote, without
    the rows' writers, the new-row count or a long list of quoted tokens; short enough for its panel's 7 lines at
    17 px (about 80 characters a line) even at its longest: every source, long tokens, many accepted."""
    from tr_core.context import LIBRARY

    long_vocab = lambda t: f"␣longtok{t:03d}"  # noqa: E731  (11 characters: shown whole, no cut)
    n = 25
    parents = [-1, 0, 0, *range(2, n - 1)]
    ev = StepEvent(step=122, position=400, tokens=list(range(n)), parents=parents,
                   depths=[0, 1, *range(1, n - 1)], ranks=[-1, 0, 1, *[8] * (n - 3)], accepted=[0, *range(2, n)],
                   emitted=[*range(2, n), 99], bonus=99, timings={"total": 9.0},
                   sources=["root", "matrix", "both", "matrix", *["context"] * (n - 4)],
                   origins=[None, None, {"where": LIBRARY, "first": 2, "last": 2, "match": 4}, None,
                            *[{"where": "answer", "first": 6, "last": 8, "match": 3}] * (n - 5),
                            {"where": LIBRARY, "first": 0, "last": 0, "match": 2}],
                   written=[(0, 3)] * n, rows_read=[0, 1, 2, 3], rows_read_values=[[5]] * 4,
                   matrix_rows=list(range(n)), matrix_values=[[7]] * n, matrix_probs=[[0.5]] * n)
    before = {0: [8]}
    full = step_story(ev, long_vocab, before)
    brief = step_story(ev, long_vocab, before, brief=True)
    assert "written by step 4" in full and "new)" in full and full.count("'␣longtok") > 6
    assert "written by" not in brief and "new)" not in brief and " rows it read" not in brief
    assert brief.startswith("Step 123 drafted 24 tokens after '␣longtok000': ")
    assert "The model agreed with 23 ('␣longtok002', '␣longtok003' and 21 more)" in brief
    assert "row '␣longtok000' now starts with '␣longtok007' (was '␣longtok005')" in brief  # the recycling itself stays (row 0 as read)
    assert len(brief) <= 560, (len(brief), brief)
    plain = make_event(4)
    assert step_story(plain, text_of, brief=True).startswith(step_story(plain, text_of)[:60])
