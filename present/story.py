"""The step story: two or three plain sentences on what one decoding step did, built from its event alone.

What was drafted (from how many adjacency-matrix rows, how much copied from the context), what the model agreed
with, the bonus token, and what the step wrote back into the matrix (the paper's "recycling"). Plain text, no
HTML: the studio and the HTML replay escape it where they show it.
"""
from __future__ import annotations

import html
from typing import Callable

from tr_core.events import StepEvent
from .heatmap import row_is_empty
from .nodes import copy_place, node_source
from .reasons import no_draft_reason
from .style import display_token

TokenText = Callable[[int], str]
MAX_QUOTED = 6  # accepted tokens quoted one by one; more are counted
BRIEF_QUOTED = 2  # ... in the brief story (the presentation view, whose tree labels the accepted path)
COPIED = ("context", "both")  # node sources that were copied from the context


def quoted(text: str, max_len: int = 12) -> str:
    """A token as the figures show it ('␣' for a space, '↵' for a newline), in quotes, as plain text."""
    return "'" + html.unescape(display_token(text, max_len)) + "'"  # display_token escapes for plotly; undo it


def _count(n: int, word: str) -> str:
    """'1 token', '3 tokens'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


END_WORDS = {"eos": "an end-of-turn token", "length": "the length limit"}  # SummaryEvent.stop_reason, in words


def ended_by(trace, step: int) -> str | None:
    """Why the answer ended, for its last step (SummaryEvent.stop_reason: "eos", "length", "stopped", ...); None
    for another step or an answer without a summary (still streaming, or an older trace)."""
    summary = getattr(trace, "summary", None)
    return summary.stop_reason if summary is not None and step == len(trace.steps) - 1 else None


def end_words(ended: str | None) -> str:
    """What ended an answer inside a step, in words: the summary's reason when known, else both possibilities."""
    return END_WORDS.get(ended or "", "a stop token or the length limit")


def step_story(ev: StepEvent, token_text: TokenText, matrix_before: dict[int, list[int]] | None = None,
               brief: bool = False, ended: str | None = None) -> str:
    """Two or three sentences on one step: the draft, what the model accepted and the bonus, the matrix write-back.

    `matrix_before` (row token -> its candidates before this step, as `MatrixTracker.update` returns them) lets the
    last sentence say which rows are new and what a rewritten row started with before; without it the story says
    what it can. `brief` leaves out the parenthetical counts (which rows, written by which steps; rows new or
    shared) and quotes fewer tokens: the presentation view's panel holds a few lines; the microscope has them.
    `ended`: why the answer ended when this is its last step (`ended_by`), named where it ends inside the step.
    """
    if len(ev.tokens) <= 1:
        parts = [_plain_sentence(ev, token_text)]
    else:
        parts = [_draft_sentence(ev, token_text, brief), _verify_sentence(ev, token_text, brief, ended)]
    parts.append(_write_sentence(ev, token_text, matrix_before, brief))
    return " ".join(p for p in parts if p)


def _plain_sentence(ev: StepEvent, token_text: TokenText) -> str:
    """A step without a draft: the forward gave one token."""
    token = ev.bonus if ev.bonus is not None else (ev.emitted[-1] if ev.emitted else None)
    reason = no_draft_reason(ev, token_text)
    head = f"Plain step: nothing was drafted ({reason})" if reason else "Plain step: nothing was drafted"
    if token is None:
        return f"{head}, and the answer ended here."
    own = quoted(token_text(token))
    return f"{head}, so the forward gave one token, the model's own {own}."


def _draft_sentence(ev: StepEvent, token_text: TokenText, brief: bool = False) -> str:
    """How many tokens were drafted after the root and where each came from: read from the adjacency matrix (from
    how many rows, written by which steps), copied from the conversation or the sample answers learned beforehand, or found in
    both."""
    nodes = range(1, len(ev.tokens))
    source = {i: node_source(ev, i) for i in nodes}
    from_matrix = [i for i in nodes if source[i] not in COPIED]
    copies = [i for i in nodes if source[i] == "context"]
    copied = len(copies)
    both = sum(1 for i in nodes if source[i] == "both")
    head = f"Step {ev.step + 1} drafted {_count(len(nodes), 'token')} after {quoted(token_text(ev.tokens[0]))}"
    if not from_matrix and not both:
        return f"{head}, all copied from {copy_place(ev, copies)}."
    parts = []
    if from_matrix:
        rows = {ev.tokens[ev.parents[i]] for i in from_matrix}
        writers = _writers(ev, from_matrix)
        if not copied and not both:
            where = f"{_count(len(rows), 'row')} of the adjacency matrix" + (f" (written by {writers})" if writers else "")
            return f"{head}, read from {where}."
        if brief:
            parts.append(f"{len(from_matrix)} from the matrix")  # "both" nodes are not counted here
        else:
            parts.append(f"{len(from_matrix)} read from the adjacency matrix alone ({_rows_of(ev, rows, writers)})")
    if copied:
        parts.append(f"{copied} copied from {copy_place(ev, copies)}")
    if both:
        found = copy_place(ev, [i for i in nodes if source[i] == "both"])
        parts.append(f"{both} in both" if brief else f"{both} found both in a matrix row and in {found}")
    return f"{head}: {_listed(parts)}."


def _rows_of(ev: StepEvent, rows: set[int], writers: str) -> str:
    """'3 of the 4 rows it read, written by steps 2 and 5': the rows behind the matrix-only drafts, among every row
    the step read ("both" nodes' rows too: the microscope lists them all)."""
    read = len(set(ev.rows_read) | rows)
    rows_of = _count(len(rows), "row") if read <= len(rows) else f"{len(rows)} of the {read} rows it read"
    return rows_of + (f", written by {writers}" if writers else "")


def _writers(ev: StepEvent, nodes: list[int]) -> str:
    """Which steps wrote the rows these nodes were read from ("steps 3, 5 and 9", "the prompt", "an earlier answer");
    '' when the event does not record it (`StepEvent.written`, absent from older traces)."""
    if ev.written is None:
        return ""
    stamps = {tuple(ev.written[i]) for i in nodes if i < len(ev.written)}
    steps = sorted({step + 1 for answer, step in stamps if answer == ev.answer and step >= 0})
    earlier = len({answer for answer, _ in stamps if 0 <= answer != ev.answer})
    parts = []
    if len(steps) > MAX_QUOTED:
        parts.append(f"{len(steps)} earlier steps, from step {steps[0]} to {steps[-1]}")
    elif steps:
        parts.append(f"step{'s' if len(steps) > 1 else ''} {_listed([str(x) for x in steps])}")
    if any(answer == ev.answer and step < 0 for answer, step in stamps):
        parts.append("the prompt")
    if earlier:
        parts.append("an earlier answer" if earlier == 1 else f"{earlier} earlier answers")
    return _listed(parts) if parts else ""


def _listed(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _verify_sentence(ev: StepEvent, token_text: TokenText, brief: bool = False, ended: str | None = None) -> str:
    """What the model agreed with, and the bonus token (or why the step has none)."""
    agreed = [ev.tokens[i] for i in ev.accepted[1:]]
    if not agreed:
        head = "The model agreed with none of them"
    else:
        most = BRIEF_QUOTED if brief else MAX_QUOTED
        shown = ", ".join(quoted(token_text(t)) for t in agreed[:most])
        more = f" and {len(agreed) - most} more" if len(agreed) > most else ""
        head = f"The model agreed with {len(agreed)} ({shown}{more})"
    if ev.bonus is None:
        end = quoted(token_text(ev.emitted[-1])) if ev.emitted else "its start"
        kept = f" after {len(ev.emitted)} of them," if agreed and len(ev.emitted) < len(agreed) else ""
        return f"{head}; the answer ended{kept} at {end} ({end_words(ended)}), so there is no bonus token."
    bonus = quoted(token_text(ev.bonus))
    if not agreed:
        return f"{head}; its own next token {bonus} is the bonus, so the step still gains one token."
    return f"{head} and added the bonus token {bonus}: {_count(len(ev.emitted), 'token')} from one forward pass."


def _read_rows(ev: StepEvent) -> dict[int, list[int]]:
    """The rows this step read or recorded before writing them that held candidates (a row never written reads as
    zeros): row -> its candidates."""
    return {row: values for row, values, probs, _ in ev.rows_before_step() if not row_is_empty(values, probs)}


def _write_sentence(ev: StepEvent, token_text: TokenText, before: dict[int, list[int]] | None,
                    brief: bool = False) -> str:
    """How many matrix rows the step rewrote, and one example: the root's row (the one the next draft reads first)."""
    rows = ev.matrix_rows
    if not rows:
        return "It wrote nothing back into the adjacency matrix."
    j = rows.index(ev.tokens[0]) if ev.tokens and ev.tokens[0] in rows else 0
    row, values = rows[j], ev.matrix_values[j] if j < len(ev.matrix_values) else []
    head = (f"It wrote {_count(len(rows), 'matrix row')} back" if brief
            else f"It wrote {_count(len(rows), 'row')} of the matrix back from this forward's candidates")
    notes = []
    if len(rows) == len(set(ev.tokens)) < len(ev.tokens):  # "25 tokens verified, 23 rows written": none lost
        notes.append(f"one per distinct token of its {len(ev.tokens)}")  # a token drafted at several nodes: one row
    if before is not None:
        before = {**before, **_read_rows(ev)}  # as the microscope counts: a row this step read is not new
        new = sum(1 for r in rows if r not in before)
        if not brief:
            notes.append(f"{_count(new, 'row')} new" if new else "no row new")  # rows, not candidates
    if notes:
        head += f" ({', '.join(notes)})"
    if not values:
        return head + "."
    example = f"{'row' if brief else 'the row of'} {quoted(token_text(row))} now starts with {quoted(token_text(values[0]))}"
    old = before.get(row) if before is not None else None
    if old and old[0] != values[0]:
        was = quoted(token_text(old[0]))
        example += f" (was {was})" if brief else f" (it started with {was} before)"
    elif old:
        example += " (as before)"
    return f"{head}; {example}."
