"""The chart of tokens gained per step (accepted drafts kept + bonus), the step shown singled out, and under it the
answer's tokens credited to where their drafts came from (the matrix, the context or both)."""
from __future__ import annotations

from tr_core.events import StepEvent
from .figure import Figure
from .nodes import node_source
from .style import ACCEPTED_COLOUR, CURRENT_COLOUR, ROOT_COLOUR


def tick_step(top: float, most: int = 6) -> int:
    """A whole tick step (1, 2, 5, 10, 20, ...) that puts at most `most` ticks above 0 on an axis up to `top`: the
    chart's 150 px axis holds no more labels without overlapping them."""
    step = 1
    while top / step > most:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


def accepted_chart(events: list[StepEvent], current: int | None = None, height: int = 220) -> Figure:
    """Tokens emitted per step (accepted draft tokens + bonus) as bars, the selected step highlighted."""
    fig = Figure.empty(height)
    lengths = [len(e.emitted) for e in events]
    if not lengths:
        return fig.note("Tokens per step")
    colours = [CURRENT_COLOUR if current is not None and i == current else ACCEPTED_COLOUR for i in range(len(lengths))]
    fig.add(type="bar", x=list(range(1, len(lengths) + 1)), y=lengths, marker=dict(color=colours), showlegend=False,
            hovertemplate="step %{x}: %{y} tokens<extra></extra>")
    mean = sum(lengths) / len(lengths)
    fig.layout["shapes"] = [dict(type="line", xref="paper", x0=0, x1=1, y0=mean, y1=mean,
                                 line=dict(color=ROOT_COLOUR, dash="dash", width=2))]
    # the mean's label in the right margin, at the end of its line: over the bars it hid some of them
    fig.layout["annotations"] = [dict(text=f"mean<br>{mean:.2f}", xref="paper", x=1.0, y=mean, yanchor="middle",
                                      xanchor="left", xshift=4, showarrow=False, align="left",
                                      font=dict(size=14, color=ROOT_COLOUR))]
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, title=dict(text="step", font=dict(size=14)),
                               tickfont=dict(size=14))
    fig.layout["yaxis"] = dict(visible=True, showgrid=True, gridcolor="#eef2f7", rangemode="tozero",
                               dtick=tick_step(max(lengths)), title=dict(text="tokens", font=dict(size=14)),
                               tickfont=dict(size=14))
    fig.layout["margin"] = dict(l=50, r=48, t=16, b=40)
    fig.layout["bargap"] = 0.15
    return fig


CREDIT_PX = 34  # the chart's two more caption lines under its axis: the answer's tokens credited (draft_credit)


def accepted_chart_explained(events: list[StepEvent], current: int | None = None, height: int = 240) -> Figure:
    """`accepted_chart` with a legend for its colours: green bars = tokens each step gained, pink = the step shown;
    under the axis, the answer's tokens credited to their sources on two lines (on one, it ran past the chart)."""
    fig = accepted_chart(events, current, height + CREDIT_PX if events else height)
    if not events:
        return fig
    entries = [(ACCEPTED_COLOUR, "tokens a step gained (the accepted drafts it kept + bonus)")]
    if current is not None and 0 <= current < len(events):
        entries.append((CURRENT_COLOUR, f"step {current + 1}: the step shown in the tree"))
    for colour, name in entries:  # legend-only markers: the bars themselves stay one trace without a legend
        fig.add(type="scatter", mode="markers", x=[None], y=[None], name=name, showlegend=True, hoverinfo="skip",
                marker=dict(symbol="square", size=12, color=colour))
    fig.layout["showlegend"] = True
    fig.layout["legend"] = dict(orientation="h", x=0.0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=14))
    fig.layout["margin"]["t"] = 34
    fig.layout["xaxis"]["title"]["text"] = "step<br>" + draft_credit(events).replace(" + ", "<br>+ ", 1)
    fig.layout["margin"]["b"] += CREDIT_PX
    return fig


def draft_credit(events: list[StepEvent]) -> str:
    """The answer's tokens as accepted drafts plus bonus tokens, the drafts credited to where they came from:
    "128 tokens = 56 accepted drafts (6 from the matrix, 20 copied, 30 both) + 72 bonus" (hybrid trees), or
    "... (all from the matrix) + ..." (the others). A reader checks it against the bars: a step whose answer ended
    inside it has no bonus, and its path counts only the drafts the answer kept."""
    counts = {"matrix": 0, "context": 0, "both": 0}
    for ev in events:  # the drafts the step emitted: an end-of-turn token or the length limit can cut the path
        for i in ev.accepted[1:1 + len(ev.emitted) - (ev.bonus is not None)]:
            source = node_source(ev, i) or "matrix"
            counts[source if source in counts else "matrix"] += 1
    drafts, bonuses = sum(counts.values()), sum(ev.bonus is not None for ev in events)
    tokens = sum(len(ev.emitted) for ev in events)
    where = ("all from the matrix" if not counts["context"] and not counts["both"] else
             f"{counts['matrix']} from the matrix, {counts['context']} copied, {counts['both']} both")
    ended = len(events) - bonuses  # steps whose answer ended inside them (its last): no bonus token
    last = "the last step" if ended == 1 else f"the {ended} steps"
    none = f" (one a step, none in {last}, where the answer ended)" if ended else ""
    return f"{tokens} tokens = {drafts} accepted drafts ({where}) + {bonuses} bonus{none}"

