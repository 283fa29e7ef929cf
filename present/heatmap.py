"""A window of the adjacency matrix (paper Sec. 3.1): the rows a step rewrote and the rows used most, each row's
candidates by rank, coloured by probability; `MatrixTracker` folds the steps' events into what the window shows."""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from tr_core.events import StepEvent
from .figure import Figure
from .nodes import node_source
from .style import MIN_FONT, REJECTED_TEXT, TokenText, fit_token, symbol_note

# Candidate probability, light to dark blue (explicit: plotly.js and plotly.py disagree on "Blues").
PROB_SCALE = [[0.0, "#f7fbff"], [0.2, "#deebf7"], [0.4, "#9ecae1"], [0.6, "#4292c6"], [0.8, "#2171b5"], [1.0, "#08306b"]]


def row_is_empty(values: list[int], probs: list[float] | None) -> bool:
    """A row never written, as a step read it: every candidate token 0 with probability 0 (a written row holds k
    distinct tokens)."""
    return len(values) > 1 and not any(values) and not any(probs or [])


@dataclass
class MatrixTracker:
    """Latest known rows of the adjacency matrix and how often each row was used, accumulated from events.

    `hits[row]` counts the steps in which a candidate of that row was accepted (its token was the parent
    of an accepted draft token): the rows that made decoding faster.
    """

    values: dict[int, list[int]] = field(default_factory=dict)
    probs: dict[int, list[float]] = field(default_factory=dict)
    hits: Counter = field(default_factory=Counter)
    writes: Counter = field(default_factory=Counter)

    def update(self, ev: StepEvent) -> dict[int, list[int]]:
        """Fold one step into the tracker: its accepted rows' hits and the rows it rewrote. Returns the candidates
        the rewritten rows held before (rows seen earlier only), which the step story compares with."""
        before = {row: self.values[row] for row in ev.matrix_rows if row in self.values}
        for i in ev.accepted[1:]:
            if node_source(ev, i) != "context":  # a token copied from the context is no candidate of the row
                self.hits[ev.tokens[ev.parents[i]]] += 1
        for j, row in enumerate(ev.matrix_rows):
            self.values[row] = list(ev.matrix_values[j])
            if j < len(ev.matrix_probs):
                self.probs[row] = list(ev.matrix_probs[j])
            self.writes[row] += 1
        return before

    def window(self, ev: StepEvent | None, max_rows: int = 12, step_rows: int = 6) -> list[int]:
        """Rows to show: those of this step's accepted path (rewritten now), then the most-hit rows."""
        rows: list[int] = []
        if ev is not None:
            touched = set(ev.matrix_rows)
            for tok in [ev.tokens[i] for i in ev.accepted] + list(ev.matrix_rows):
                if tok in touched and tok in self.values and tok not in rows:
                    rows.append(tok)
                if len(rows) >= step_rows:
                    break
        for row, _ in self.hits.most_common():
            if len(rows) >= max_rows:
                break
            if row in self.values and row not in rows:
                rows.append(row)
        return rows


ROW_EM = 6.6  # a row label's width in em at most (its monospaced 16 px type: 11 characters)
CELL_EM = 3.0  # a cell label's width in em at most: 8 columns of MIN_FONT text fit a 600 px plot


def unique_labels(rows: list[int], token_text: TokenText, max_em: float = ROW_EM) -> list[str]:
    """Row labels from token strings (a special token as its short sign, a long one cut to `max_em`), made unique by
    appending the token id where two look the same; HTML-escaped (plotly renders a subset of HTML)."""
    shown = [html.escape(fit_token(token_text(r), max_em, mono=True), quote=False) for r in rows]
    counts = Counter(shown)
    return [f"{s} #{r}" if counts[s] > 1 else s for s, r in zip(shown, rows)]


def heatmap_figure(tracker: MatrixTracker, ev: StepEvent | None, token_text: TokenText,
                   max_rows: int = 6, height: int = 270) -> Figure:
    """A window of the adjacency matrix: rows = tokens, columns = candidate rank, colour = candidate probability.

    It shows the matrix as it is after step `ev` (the tracker has folded in every step up to it): first the rows
    this step rewrote (the rows of its accepted path first), then the rows whose candidates were accepted most
    often so far; the title and the line under it say so.
    """
    fig = Figure.empty(height)
    rows = tracker.window(ev, max_rows=max_rows)
    if not rows:
        return fig.note("Rows of the adjacency matrix appear here")
    touched = set(ev.matrix_rows) if ev is not None else set()
    k = max(len(tracker.values[r]) for r in rows)
    labels = unique_labels(rows, token_text)
    labels = [("● " if r in touched else "") + lab for lab, r in zip(labels, rows)]
    z, text, hover = [], [], []
    for r in rows:
        vals = tracker.values[r] + [None] * (k - len(tracker.values[r]))
        probs = tracker.probs.get(r, [])
        z.append([probs[j] if j < len(probs) else None for j in range(k)])
        text.append([html.escape(fit_token(token_text(v), CELL_EM), quote=False) if v is not None else ""
                     for v in vals])
        hover.append([
            (f"row {html.escape(repr(token_text(r)))} (id {r}) → rank {j}: {html.escape(repr(token_text(v)))} (id {v})"
             + (f"<br>p = {probs[j]:.3f}" if j < len(probs) else "")
             + f"<br>hits {tracker.hits[r]} (steps that accepted its candidate), rewrites {tracker.writes[r]}")
            if v is not None else "" for j, v in enumerate(vals)])
    # Reversed so that the first row is drawn at the top.
    fig.add(type="heatmap", z=z[::-1], x=[f"#{j}" for j in range(k)], y=labels[::-1], text=text[::-1],
            texttemplate="%{text}", textfont=dict(size=MIN_FONT), hovertext=hover[::-1], hoverinfo="text",
            colorscale=PROB_SCALE, zmin=0.0, zmax=1.0, xgap=2, ygap=2,
            colorbar=dict(title=dict(text="p", side="top"), thickness=12, len=0.8))  # "p" over the bar: the
    # cells get the width a sideways "probability" took (the presentation view's 8 columns of 16 px text)
    fig.layout["margin"] = dict(l=10, r=10, t=64, b=40)
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, side="bottom", tickfont=dict(size=MIN_FONT), ticks="",
                               type="category", automargin=True,  # the title below the rank labels, never on them
                               title=dict(text="candidate rank", font=dict(size=MIN_FONT), standoff=8))
    fig.layout["yaxis"] = dict(visible=True, showgrid=False, tickfont=dict(size=MIN_FONT, family="monospace"),
                               automargin=True, ticks="", ticklabelstandoff=6)  # no tick: "␣tem-" read as a token
    _caption_heatmap(fig, ev, [r in touched for r in rows], labels + [t for line in text for t in line])
    return fig


def _caption_heatmap(fig: Figure, ev: StepEvent | None, rewritten: list[bool], texts: list[str]) -> None:
    """Title: which moment the window shows, and under it why these rows; the legend of ␣/↵ by the rank axis."""
    if ev is None:
        why = "rows with the most hits (candidates accepted)"
    elif any(rewritten):
        shown, total = sum(rewritten), len(ev.matrix_rows)
        part = f"{shown} of the {total} " if shown < total else ""  # "It wrote 16 rows" beside 6: say which
        why = f"● {part}rows this step rewrote (accepted path first)"
        why += " · others: most hits so far" if not all(rewritten) else ""
    else:
        why = "this step rewrote none of these rows · shown: most hits so far"
    title = "Adjacency matrix" + (f" after step {ev.step + 1}" if ev is not None else "")
    fig.title(f'{title}<br><span style="font-size:{MIN_FONT}px;color:{REJECTED_TEXT}">{why}</span>')
    note = symbol_note(texts)
    if note:
        fig.layout["xaxis"]["title"]["text"] += f"     ({note})"
