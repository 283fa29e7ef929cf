"""One decoding step under the microscope: the matrix rows it read, the tree built from them, the verdict of its one
forward, and the rows it wrote back, before and after (paper Sec. 3.1-3.3 on one step).

`step_microscope(trace, i)` explains step i as plain data, from the trace alone (the rows read and the model's
choices are recorded in each StepEvent: `rows_read*`, `choices`). `microscope_blocks` turns that into a small tree
of text blocks, which `microscope_view` renders as escaped HTML for the studio and the offline replay renders
with `textContent` in the browser (present/replay.py): both draw the same blocks, so they cannot disagree.
Everything shown from a trace is text: no string of a trace becomes markup.
"""
from __future__ import annotations

import html
from typing import Any, Iterator

from tr_core.events import StepEvent
from .heatmap import row_is_empty
from .nodes import node_origin, node_source, place_of
from .reasons import PLACES, no_draft_reason, origin_text
from .style import visible_token
from .story import end_words, ended_by
from tr_core.trace import Trace

MAX_READS_SHOWN = 3  # rows read shown open; the others sit in a folded list below them
MAX_WRITES_SHOWN = 2  # rows written shown open, before and after
MAX_READS_LISTED = 24  # rows read listed in all (open and folded); a step of the paper's tree reads about 20-40
MAX_WRITES_LISTED = 10  # rows written listed in all (a step writes one per node: 81 for the paper's tree)
MAX_OFFERED = 4  # tokens the draft offered at the first disagreement, quoted one by one
MAX_COPIED_SHOWN = 16  # boxes of copied drafts listed; more are counted
RUN_MIN = 3  # copied drafts in one run shown as one box ("14 copied in one run from this answer's tokens 84-97")
TOKEN_CHARS = 12  # longest token label
BLOCK_TAGS = ("div", "span", "details", "summary")  # the only tags a block may be (the JS renderer checks too)


def _text(trace: Trace, token: int) -> str:
    """A token as the figures show it ('␣' for a space, '↵' for a newline), not escaped."""
    return visible_token(trace.token_text(token), TOKEN_CHARS)


def _percent(p: float | None) -> str:
    """'41%'; '<1%' under half a percent; '' when unknown."""
    if p is None:
        return ""
    return "<1%" if p < 0.005 else f"{p * 100:.0f}%"


# ------------------------------------------------------------------------------------------------- the data


class KnownRows:
    """What a trace says about the matrix rows so far: each row's candidates and probabilities, as last read or
    written by a step of the same answer (an answer's prompt seeding rewrites rows the trace does not see)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[list[int], list[float] | None, str]] = {}  # row -> (values, probs, said by)
        self.answer: int | None = None

    def before(self, ev: StepEvent) -> dict[int, tuple[list[int], list[float] | None, str]]:
        """The known rows just before step `ev`: those it read or recorded before writing them (exact), else the
        last seen in this answer."""
        if ev.answer != self.answer:
            self.rows, self.answer = {}, ev.answer
        known = dict(self.rows)
        for row, values, probs, read in ev.rows_before_step():
            known[row] = (values, probs, "read by this step" if read else "as it was before this step")
        return known

    def fold(self, ev: StepEvent) -> None:
        """Take in what step `ev` read and wrote."""
        self.rows = self.before(ev)
        for j, row in enumerate(ev.matrix_rows):
            probs = ev.matrix_probs[j] if j < len(ev.matrix_probs) else None
            self.rows[row] = (list(ev.matrix_values[j]), probs, f"written by step {ev.step + 1}")


def _children(ev: StepEvent) -> dict[int, list[int]]:
    """Node -> its child nodes."""
    kids: dict[int, list[int]] = {}
    for i in range(1, len(ev.tokens)):
        kids.setdefault(ev.parents[i], []).append(i)
    return kids


def _choice(ev: StepEvent, node: int) -> int | None:
    """The model's own choice after `node`: recorded per node, else known on the accepted path only."""
    if node < len(ev.choices):
        return ev.choices[node]
    path = ev.accepted
    if node in path:
        j = path.index(node) + 1
        return ev.tokens[path[j]] if j < len(path) else ev.bonus
    return None


def _reads(trace: Trace, ev: StepEvent) -> list[dict[str, Any]]:
    """Every row read: its candidates before the step and the tree nodes each became (which row gave which child)."""
    accepted, kids = set(ev.accepted), _children(ev)
    parents_of: dict[int, list[int]] = {}  # token -> the nodes holding it that have children
    for p in kids:
        parents_of.setdefault(ev.tokens[p], []).append(p)
    out = []
    for j, row in enumerate(ev.rows_read):
        values = ev.rows_read_values[j]
        probs = ev.rows_read_probs[j] if j < len(ev.rows_read_probs) else None
        readers = sorted(parents_of.get(row, []))
        made: dict[int, list[int]] = {}
        for p in readers:
            for c in kids[p]:
                if node_source(ev, c) != "context" and 0 <= ev.ranks[c] < len(values):
                    made.setdefault(ev.ranks[c], []).append(c)
        empty = row_is_empty(values, probs)
        cands = [{"rank": r, "token": t, "text": _text(trace, t), "prob": probs[r] if probs and not empty else None,
                  "nodes": made.get(r, []), "accepted": any(c in accepted for c in made.get(r, [])),
                  "seeded": any(_seeded(ev, c) for c in made.get(r, []))}
                 for r, t in enumerate(values)]
        out.append({"row": row, "text": _text(trace, row), "readers": readers,
                    "depths": sorted({ev.depths[p] for p in readers}), "empty": empty,
                    "on_path": any(p in accepted for p in readers),
                    "candidates": cands})
    return out


def _seeded(ev: StepEvent, node: int) -> bool:
    """Whether node's candidate was put in its row by an answer's prompt seeding (stored at a flat prior, not
    scored by the model): StepEvent.written says step -1 of an answer."""
    return ev.written is not None and node < len(ev.written) and ev.written[node][0] >= 0 and ev.written[node][1] == -1


def _copied(trace: Trace, ev: StepEvent) -> list[dict[str, Any]]:
    """The draft tokens copied from the conversation or the sample answers learned beforehand (hybrid trees), with where they were
    found."""
    out = []
    for i in range(1, len(ev.tokens)):
        source = node_source(ev, i)
        if source in ("context", "both"):
            p = ev.parents[i]
            origin = node_origin(ev, i)
            out.append({"node": i, "parent": p, "token": ev.tokens[i], "text": _text(trace, ev.tokens[i]),
                        "after": _text(trace, ev.tokens[p]), "origin": origin, "origin_text": origin_text(origin),
                        "also_matrix": source == "both", "accepted": i in ev.accepted})
    return out


def _verdict(trace: Trace, ev: StepEvent, ended: str | None = None) -> dict[str, Any]:
    """What the forward decided: every node's agreement, the accepted path, the bonus, the first disagreement, and
    (`ended`, for the answer's last step) why the answer ended."""
    choices = [_choice(ev, i) for i in range(len(ev.tokens))]
    accepted = set(ev.accepted)
    nodes = []
    for i, choice in enumerate(choices):
        chosen = choices[ev.parents[i]] if i else None  # what the model chose where this node was drafted
        nodes.append({"node": i, "token": ev.tokens[i], "depth": ev.depths[i], "choice": choice,
                      "choice_text": _text(trace, choice) if choice is not None else "",
                      "agrees": None if chosen is None else ev.tokens[i] == chosen, "accepted": i in accepted})
    end = ev.accepted[-1]
    offered = _children(ev).get(end, [])
    disagreement = None
    if offered:
        choice = _choice(ev, end)
        disagreement = {"node": end, "after": _text(trace, ev.tokens[end]),
                        "offered": [{"node": c, "token": ev.tokens[c], "text": _text(trace, ev.tokens[c])}
                                    for c in offered],
                        "choice": choice, "choice_text": _text(trace, choice) if choice is not None else ""}
    return {"nodes": nodes, "drafted": len(ev.tokens) - 1,
            "path": [{"node": i, "token": ev.tokens[i], "text": _text(trace, ev.tokens[i])} for i in ev.accepted],
            "bonus": None if ev.bonus is None else {"token": ev.bonus, "text": _text(trace, ev.bonus)},
            "emitted": len(ev.emitted), "disagreement": disagreement, "ended": ended}


def _cell_data(trace: Trace, token: int, prob: float | None, new: bool) -> dict[str, Any]:
    """One candidate of a row written: token, its label, probability, whether it is new to the row."""
    return {"token": token, "text": _text(trace, token), "prob": prob, "new": new}


def _writes(trace: Trace, ev: StepEvent, known: dict) -> list[dict[str, Any]]:
    """Every row written back: before (when the trace knows it) and after, cell by cell, marking what changed."""
    path_rows = {ev.tokens[i] for i in ev.accepted}
    out = []
    for j, row in enumerate(ev.matrix_rows):
        after = ev.matrix_values[j]
        probs = ev.matrix_probs[j] if j < len(ev.matrix_probs) else None
        old = known.get(row)
        before_vals, before_probs, said = old if old is not None else (None, None, "")
        if before_vals is not None and row_is_empty(before_vals, before_probs):
            status = "new"
        elif before_vals is None:
            status = "unknown"
        else:
            status = "same" if list(before_vals) == list(after) else "changed"
        fresh = status in ("changed", "new")
        before = None if before_vals is None else [
            _cell_data(trace, t, before_probs[r] if before_probs else None, False) for r, t in enumerate(before_vals)]
        out.append({"row": row, "text": _text(trace, row), "status": status, "before_from": said,
                    "on_path": row in path_rows, "before": before,
                    "after": [_cell_data(trace, t, probs[r] if probs else None, fresh and t not in (before_vals or []))
                              for r, t in enumerate(after)]})
    return out


def explain(trace: Trace, i: int, known: dict) -> dict[str, Any]:
    """Step i of `trace` explained as plain data, given the rows known just before it (`KnownRows.before`)."""
    ev = trace.steps[i]
    writes = _writes(trace, ev, known)
    counts = {s: sum(1 for w in writes if w["status"] == s) for s in ("changed", "same", "new", "unknown")}
    return {"step": i, "number": ev.step + 1, "root": {"token": ev.tokens[0], "text": _text(trace, ev.tokens[0])},
            "recorded": bool(ev.rows_read) or len(ev.tokens) == 1, "k": _k(ev),
            "no_draft": no_draft_reason(ev, trace.token_text) or "",
            "reads": _reads(trace, ev), "copied": _copied(trace, ev), "verdict": _verdict(trace, ev, ended_by(trace, i)),
            "writes": writes, "write_counts": counts}


def _k(ev: StepEvent) -> int:
    """Candidates per matrix row, as the step's rows show it (0: no row recorded)."""
    rows = ev.rows_read_values or ev.matrix_values
    return len(rows[0]) if rows else 0


def rows_before(trace: Trace, i: int) -> dict[int, list[int]]:
    """Row -> its candidates just before step i, as far as the trace knows them (an empty row read counts as
    unknown): the step story's `matrix_before`, so that it counts the same new rows as the microscope."""
    return values_known(_known_at(trace, i))


def _known_at(trace: Trace, i: int) -> dict:
    """The rows known just before step i: steps 0..i-1 folded, then step i's reads."""
    rows = KnownRows()
    for ev in trace.steps[:i]:
        rows.fold(ev)
    return rows.before(trace.steps[i])


def values_known(known: dict) -> dict[int, list[int]]:
    """The candidates of the known rows that were not empty."""
    return {row: values for row, (values, probs, _) in known.items() if not row_is_empty(values, probs)}


def step_microscope(trace: Trace, i: int) -> dict[str, Any]:
    """Step i (0-based index into trace.steps) under the microscope, as plain data (see the module docstring)."""
    if not 0 <= i < len(trace.steps):
        raise IndexError(f"step {i} is not in this trace ({len(trace.steps)} steps)")
    return explain(trace, i, _known_at(trace, i))


def known_before(trace: Trace) -> Iterator[dict]:
    """The rows known just before each step (`KnownRows.before`), folding the trace once (for the offline replay)."""
    rows = KnownRows()
    for ev in trace.steps:
        yield rows.before(ev)
        rows.fold(ev)


# ----------------------------------------------------------------------------------------------- the blocks
# A block is {"t": tag, "c": classes, "x": text} or {"t": tag, "c": classes, "k": [blocks]}: plain data that the
# studio renders as escaped HTML (`render_blocks`) and the offline replay with textContent (replay.py).


def _b(tag: str, cls: str, content: str | list[dict]) -> dict[str, Any]:
    """One block: text (a string) or children (a list of blocks)."""
    return {"t": tag, "c": cls, "x": content} if isinstance(content, str) else {"t": tag, "c": cls, "k": content}


def _q(text: str) -> str:
    """A token label in quotes."""
    return f"'{text}'"


def _cell(text: str, prob: float | None, cls: str, mark: str = "") -> dict[str, Any]:
    """One candidate: its token and probability (and a mark: ✓ accepted, + new in the row)."""
    return _b("span", f"trm-cell {cls}".strip(), " ".join(part for part in (text, _percent(prob), mark) if part))


def _read_row(r: dict[str, Any]) -> dict[str, Any]:
    """One row read: its token, where it was read, and its candidates (outlined: drafted, green: accepted)."""
    where = f" · read at depth{'s' if len(r['depths']) > 1 else ''} " + ", ".join(map(str, r["depths"]))
    head = f"row {_q(r['text'])}{where if r['depths'] else ''}" + (" · empty (never written)" if r["empty"] else "")
    cells = []
    for c in r["candidates"]:
        cls = "trm-ok" if c["accepted"] else ("trm-drafted" if c["nodes"] else "trm-unused")
        mark = " ".join(m for m in ("prompt" if c.get("seeded") else "", "✓" if c["accepted"] else "") if m)
        cells.append(_cell(c["text"], None if c.get("seeded") else c["prob"], cls, mark))
    return _b("div", "trm-row", [_b("div", "trm-rowname", head), _b("div", "trm-cells", cells)])


def _folded(rows: list[dict[str, Any]], total: int, what: str, shown: int) -> list[dict[str, Any]]:
    """The first `shown` row blocks open, the other listed ones in a folded list; of `total` rows in all."""
    if total <= shown:
        return rows
    left = total - shown
    more = [_b("summary", "", f"{left} more {what.replace('rows', 'row', 1) if left == 1 else what}"), *rows[shown:]]
    if total > len(rows):
        more.append(_b("div", "trm-note", f"… and {total - len(rows)} more, not listed here"))
    return rows[:shown] + [_b("details", "trm-more", more)]


def _read_section(m: dict[str, Any]) -> dict[str, Any]:
    """① the rows read and what became of their candidates; tokens copied from the conversation."""
    reads = sorted(m["reads"], key=lambda r: not r["on_path"])  # stable: the accepted path's rows first
    n = len(reads)
    head = f"① Read: {n} row{'s' if n != 1 else ''} of the adjacency matrix, as they were before this step"
    if not m["recorded"]:
        head = "① Read: this trace did not record the rows the draft read (recorded by newer versions)"
    elif not reads and not m["copied"]:
        head = f"① Read: nothing ({m['no_draft'] or 'no draft this step: the forward checks the last token alone'})"
    blocks = [_b("div", "trm-h", head)]
    if reads:
        blocks.append(_b("div", "trm-note", f"Each row: the {m['k']} tokens last seen after its token, with the "
                                            "probability stored when it was last written. Outlined: drafted. Green ✓: accepted."))
        blocks.append(_b("details", "trm-more", [
            _b("summary", "", "Why these were drafted, and a lower percentage before a higher one"),
            _b("div", "trm-note", "Every step rewrites the row of each token in its tree, drafted or accepted. The "
                                  "tree keeps the candidates it rates likeliest to be accepted, as many as pay on this "
                                  "machine: each rated by how often candidates stored with a probability like its own "
                                  "were accepted so far (rows written before this answer have rates of their own), "
                                  "times its parent's rating. 'prompt': put first by the prompt's own text (the token "
                                  "that followed it there), at a flat 50% prior, before the model scored it.")]))
    blocks += _folded([_read_row(r) for r in reads[:MAX_READS_LISTED]], n, "rows read", MAX_READS_SHOWN)
    if reads and m["copied"] and not any(c["nodes"] for r in reads for c in r["candidates"]):
        place = place_of([c["origin"] for c in m["copied"]])
        blocks.append(_b("div", "trm-note", f"None of these rows' candidates was drafted: the copies from {place} "
                                            "below were rated more likely to be accepted."))
    if m["copied"]:
        blocks.append(_copied_row(m["copied"]))
    return _b("div", "trm-sec", blocks)


def copy_runs(copied: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The copied drafts grouped into runs: a chain of nodes, each the child of the one before, copied from the next
    token of one place (same `where` and run start, `last` one further); a branch or a new place starts a run."""
    runs: list[list[dict[str, Any]]] = []
    ends: dict[int, list[dict[str, Any]]] = {}  # the node a run ends at -> the run
    for c in copied:
        run, o = ends.pop(c["parent"], None), c["origin"]
        prev = run[-1]["origin"] if run else None
        if not (prev and o and (o["where"], o["first"], o["last"]) == (prev["where"], prev["first"], prev["last"] + 1)):
            run = []
            runs.append(run)
        run.append(c)
        ends[c["node"]] = run
    return runs


def _run_cell(run: list[dict[str, Any]]) -> dict[str, Any]:
    """One box for a run of RUN_MIN or more copied drafts ("'␣the' … '␣end': 14 copied in one run from this answer's
    tokens 84-97, 12 accepted"); a shorter run's drafts get a box each."""
    first, last, kept = run[0], run[-1], sum(c["accepted"] for c in run)
    o, p = first["origin"], last["origin"]
    where = PLACES.get(o["where"], "the context")
    text = (f"{_q(first['text'])} … {_q(last['text'])} after {_q(first['after'])}: {len(run)} copied in one run from "
            f"{where}'s tokens {o['last'] + 1}-{p['last'] + 1}, "
            + ("all accepted ✓" if kept == len(run) else f"{kept} accepted" if kept else "none accepted"))
    return _b("span", "trm-cell " + ("trm-ok" if kept else "trm-drafted"), text)


def _copied_row(copied: list[dict[str, Any]]) -> dict[str, Any]:
    """The draft tokens copied from the conversation: a run of RUN_MIN or more in one box, others one by one (up to
    MAX_COPIED_SHOWN boxes, then counted)."""
    both = sum(1 for c in copied if c["also_matrix"])
    head = f"{len(copied)} drafted from {place_of([c['origin'] for c in copied])}" + (
        f" ({both} of them also drafted from the matrix)" if both else ", not from the matrix")
    cells = []
    for run in copy_runs(copied):
        if len(run) >= RUN_MIN:
            cells.append(_run_cell(run))
            continue
        cells += [_b("span", "trm-cell " + ("trm-ok" if c["accepted"] else "trm-drafted"),
                     f"{_q(c['text'])} after {_q(c['after'])}" + (f" ({c['origin_text']})" if c["origin_text"] else "")
                     + (" ✓" if c["accepted"] else "")) for c in run]
    if len(cells) > MAX_COPIED_SHOWN:
        cells = cells[:MAX_COPIED_SHOWN] + [_b("span", "trm-label", f"… and {len(cells) - MAX_COPIED_SHOWN} more")]
    return _b("div", "trm-row", [_b("div", "trm-rowname", head), _b("div", "trm-cells", cells)])


def _verdict_section(m: dict[str, Any]) -> dict[str, Any]:
    """② the forward's verdict: the accepted path, the bonus token and the first disagreement."""
    v = m["verdict"]
    head = f"② Verdict: one forward checked {v['drafted']} drafted token{'s' if v['drafted'] != 1 else ''}"
    path = [_b("span", "trm-cell trm-root", _q(v["path"][0]["text"]))]
    kept = v["emitted"] - (v["bonus"] is not None)  # drafts past the answer's end were accepted but not kept
    for n, p in enumerate(v["path"][1:], 1):
        cell = (_b("span", "trm-cell trm-ok", f"{_q(p['text'])} ✓") if n <= kept else
                _b("span", "trm-cell trm-past", f"{_q(p['text'])} ✓ not kept"))
        path += [_b("span", "trm-arrow", "→"), cell]
    if v["bonus"] is not None:
        path += [_b("span", "trm-arrow", "→"), _b("span", "trm-cell trm-bonus", f"★ {_q(v['bonus']['text'])} bonus")]
    d = v["disagreement"]
    if d is not None:
        offered = ", ".join(_q(o["text"]) for o in d["offered"][:MAX_OFFERED])
        more = f" and {len(d['offered']) - MAX_OFFERED} more" if len(d["offered"]) > MAX_OFFERED else ""
        chose = f"the model chose {_q(d['choice_text'])}" if d["choice"] is not None else "the model chose otherwise"
        why = f"First disagreement after {_q(d['after'])}: the draft offered {offered}{more}; {chose}."
    elif v["bonus"] is None:
        accepted = len(v["path"]) - 1
        kept = f", after {v['emitted']} of its {accepted} accepted tokens" if v["emitted"] < accepted else ""
        why = f"The answer ended inside this step ({end_words(v['ended'])}){kept}: no bonus token."
    elif v["drafted"]:
        why = "Every drafted token on this path was accepted, to the end of its branch."
    else:
        why = "Nothing was drafted: the forward gave the model's own next token."
    gain = f"{v['emitted']} token{'s' if v['emitted'] != 1 else ''} from one forward."
    return _b("div", "trm-sec", [_b("div", "trm-h", head), _b("div", "trm-path", path),
                                 _b("div", "trm-note", f"{why} {gain}")])


STATUS_WORDS = {"changed": "changed", "same": "same candidates", "new": "new: it was empty",
                "unknown": "written: its earlier candidates are not in this trace"}


def _write_row(w: dict[str, Any]) -> dict[str, Any]:
    """One row written: before (when known) and after, the candidates new to the row marked."""
    lines = [_b("div", "trm-rowname", f"row {_q(w['text'])} · {STATUS_WORDS[w['status']]}")]
    if w["before"] is not None and w["status"] != "new":
        lines.append(_b("div", "trm-cells", [_b("span", "trm-label", "before"),
                                             *[_cell(c["text"], c["prob"], "trm-old") for c in w["before"]]]))
    after = [_cell(c["text"], c["prob"], "trm-new" if c["new"] else "trm-kept", "+" if c["new"] else "")
             for c in w["after"]]
    lines.append(_b("div", "trm-cells", [_b("span", "trm-label", "after"), *after]))
    return _b("div", "trm-row", lines)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _write_section(m: dict[str, Any]) -> dict[str, Any]:
    """③ the rows written back from this forward's top-k, before and after."""
    writes, counts = m["writes"], m["write_counts"]
    if not writes:
        return _b("div", "trm-sec", [_b("div", "trm-h", "③ Written back: nothing (plain decoding recycles nothing)")])
    order = {"changed": 0, "new": 1, "same": 2, "unknown": 3}
    shown = sorted(writes, key=lambda w: (not w["on_path"], order[w["status"]]))
    each = "each from its node's" if len(writes) != 1 else "from its node's"
    head = f"③ Written back: {_rows(len(writes))}, {each} top-{m['k']}"
    parts = [f"{_rows(counts['changed'])} changed", f"{_rows(counts['new'])} new (empty before)",
             f"{_rows(counts['same'])} with the same candidates"]
    if counts["unknown"]:  # a trace from before steps recorded the rows they wrote without reading
        parts.append(f"{_rows(counts['unknown'])} whose earlier candidates this trace does not hold")
    note = (", ".join(parts) + ". + marks a candidate that was not in its row before; the accepted path's rows "
            "come first.")
    return _b("div", "trm-sec", [_b("div", "trm-h", head), _b("div", "trm-note", note),
                                 *_folded([_write_row(w) for w in shown[:MAX_WRITES_LISTED]], len(shown),
                                          "rows written", MAX_WRITES_SHOWN)])


def microscope_blocks(m: dict[str, Any]) -> dict[str, Any]:
    """The microscope of one step (`step_microscope`'s data) as blocks: a title and the three sections."""
    title = f"Step {m['number']} under the microscope · drafted after {_q(m['root']['text'])}"
    return _b("div", "trm", [_b("div", "trm-title", title), _read_section(m), _verdict_section(m), _write_section(m)])


def render_blocks(block: dict[str, Any]) -> str:
    """Blocks as HTML: every text escaped, tags from BLOCK_TAGS only."""
    tag = block["t"] if block["t"] in BLOCK_TAGS else "div"
    cls = html.escape(block.get("c", ""), quote=True)
    inner = html.escape(block["x"], quote=False) if "x" in block else "".join(map(render_blocks, block["k"]))
    return f'<{tag} class="{cls}">{inner}</{tag}>'


def microscope_view(trace: Trace, step: int) -> str:
    """Step `step` (0-based) under the microscope as escaped HTML with its own style, for the studio's pages."""
    if not trace.steps:
        return f'<style>{CSS}</style><div class="trm"><div class="trm-h">No step to show yet.</div></div>'
    step = max(0, min(step, len(trace.steps) - 1))
    return f"<style>{CSS}</style>" + render_blocks(microscope_blocks(step_microscope(trace, step)))


# Readable in a lecture hall: nothing under 16 px; colours as the tree's (green accepted, amber bonus).
CSS = """
.trm {font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 16px; line-height: 1.35;
      color: #1f2937; background: #ffffff; border: 1px solid #e2e8f0; border-radius: 10px; padding: 8px 10px;
      max-width: 640px}
.trm-title {font-size: 18px; font-weight: 700; margin-bottom: 4px}
.trm-sec {border-top: 1px solid #e2e8f0; padding: 6px 0 4px 0}
.trm-h {font-weight: 700; color: #1e3a8a}
.trm-note {color: #475569; margin: 2px 0 4px 0}
.trm-row {margin: 4px 0 6px 0}
.trm-rowname {font-weight: 600}
.trm-cells, .trm-path {display: flex; flex-wrap: wrap; gap: 3px 4px; align-items: center; margin-top: 2px}
.trm-cell {font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 16px; white-space: pre-wrap;
           overflow-wrap: anywhere; max-width: 100%; border: 1px solid #cbd5e1; border-radius: 5px; padding: 0 4px; background: #f8fafc}
.trm-unused {color: #64748b; border-style: dashed}
.trm-drafted {border: 2px solid #1e3a8a; background: #eff6ff}
.trm-ok {border: 2px solid #16a34a; background: #dcfce7; font-weight: 700}
.trm-past {border: 2px dashed #16a34a; background: #f0fdf4; color: #475569}
.trm-root {border: 2px solid #1e3a8a; background: #1e3a8a; color: #ffffff !important}  /* the studio's prose colour would win */
.trm-bonus {border: 2px solid #f59e0b; background: #fef3c7; font-weight: 700}
.trm-old {color: #475569}
.trm-kept {background: #f8fafc}
.trm-new {border: 2px solid #7c3aed; background: #f3e8ff; font-weight: 700}
.trm-label {min-width: 3.6em; color: #475569}
.trm-arrow {color: #475569}
.trm-more summary {cursor: pointer; color: #1e3a8a; font-size: 16px}
"""
