"""The side-by-side's pictures (studio/side_by_side.py): each method's tree, and why one is faster on this machine.

A method's speed over plain decoding is what a step gains over what a step costs: its tokens per step over its
step time in plain steps. The picture draws both as bars, green beside grey, for plain decoding and each method;
where green stands above grey, the method beats plain decoding. The tour's last screen reads the same way.
"""
from __future__ import annotations

import math

from tr_core.events import StepEvent

from .nodes import node_group, node_source
from .style import ACCEPTED_COLOUR, BONUS_COLOUR, REJECTED_COLOUR, REJECTED_TEXT
from .tour import step_figures, telling_index
from .tour_pictures import INK, UNDER_ONE, node_fill, shape, text, wrapped
from .tree_layout import tree_layout

COST_COLOUR = "#94a3b8"  # the grey of a step's cost (the tour's cost curve is this family)
LOSS_COLOUR = "#b91c1c"  # a speed under plain decoding's
TREE_W, TREE_H = 600, 300  # a method's tree: shapes only; its caption says what the step did


def best_step(steps: list[StepEvent]) -> StepEvent | None:
    """The step each card draws: by the rule the page picks the step it shows (present.tour.telling_step), the one
    with the most matrix drafts accepted, then the most tokens."""
    return steps[telling_index(steps)] if steps else None


def silhouette_svg(ev: StepEvent) -> str:
    """A step's tree without words, depth across: how many drafts it checked, and the path the model agreed with
    (green), its bonus token (amber star). Shapes as everywhere: circle the matrix, square copied, diamond both."""
    depth = max(ev.depths, default=0)
    col = (TREE_W - 80) / max(depth + 1, 1)
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    xy = {i: (30 + ev.depths[i] * col, 16 + layout.x[i] * (TREE_H - 32)) for i in range(len(ev.tokens))}
    groups, path = node_group(ev), set(ev.accepted)
    r = max(3.5, min(10.0, (TREE_H - 32) / (2.6 * max(_widest(ev), 1))))
    body = [f'<line x1="{xy[ev.parents[i]][0]:.0f}" y1="{xy[ev.parents[i]][1]:.0f}" x2="{xy[i][0]:.0f}" '
            f'y2="{xy[i][1]:.0f}" stroke="{ACCEPTED_COLOUR if i in path else REJECTED_COLOUR}" '
            f'stroke-width="{5 if i in path else 1.5}"/>' for i in range(1, len(ev.tokens))]
    body += [shape("root" if i == 0 else node_source(ev, i) or "matrix", *xy[i], node_fill(groups[i], True), r)
             for i in sorted(xy, key=lambda i: i in path)]  # the path on top
    if ev.bonus is not None:
        x, y = xy[ev.accepted[-1]]
        body.append(_star(x + col, y, 2 * r + 4))
    return (f'<svg width="{TREE_W}" height="{TREE_H}" viewBox="0 0 {TREE_W} {TREE_H}" role="img">'
            f'{"".join(body)}</svg>')


def _widest(ev: StepEvent) -> int:
    return max((ev.depths.count(d) for d in set(ev.depths)), default=1)


def _star(x: float, y: float, r: float) -> str:
    """The bonus token's star as a shape (the tour writes "★" as text; a silhouette holds no text, so that a card
    scaled down on a projector has none to read)."""
    points = " ".join(f"{x + (r if k % 2 == 0 else r * 0.45) * math.sin(k * math.pi / 5):.1f},"
                      f"{y - (r if k % 2 == 0 else r * 0.45) * math.cos(k * math.pi / 5):.1f}" for k in range(10))
    return f'<polygon points="{points}" fill="{BONUS_COLOUR}"/>'


PAYS_W, PAYS_H = 1200, 330  # four pairs fit: plain decoding and three methods
PLOT = (118, 258)  # the bars' top and floor (px)


def pays_svg(methods: list[tuple[str, float, float, float]]) -> str:
    """Why each method is as fast as it is: (name, tokens per step, a step's cost in plain steps, the measured
    speed over plain decoding, their ratio) a pair of bars each, green (gained) beside grey (cost), the speed
    above them."""
    top, floor = PLOT
    high = max([v for _, tokens, cost, _ in methods for v in (tokens, cost)] + [1.0]) * 1.12
    y_of = lambda v: floor - (floor - top) * v / high  # noqa: E731
    slot = (PAYS_W - 40) / max(len(methods), 1)
    body = [text(20, 22, "green: tokens a step gains", 22, ACCEPTED_COLOUR, "start", bold=True),
            text(398, 22, "grey: a step's time, in plain steps", 22, "#475569", "start", bold=True),
            text(20, 50, "both averaged over the answer, as timed against plain decoding", 22, "#475569", "start"),
            text(PAYS_W - 20, 22, "speed = green ÷ grey", 22, INK, "end", bold=True),
            f'<line x1="20" y1="{y_of(1):.0f}" x2="{PAYS_W - 20}" y2="{y_of(1):.0f}" stroke="{INK}" '
            f'stroke-dasharray="6 6" stroke-width="1.5"/>',
            f'<line x1="20" y1="{floor}" x2="{PAYS_W - 20}" y2="{floor}" stroke="{INK}" stroke-width="2"/>']
    # as the tour's tile prints them: the digits that give the speed back from the figures shown
    shown = [step_figures(tokens, speed) for _, tokens, _, speed in methods]
    for j, ((name, tokens, cost, speed), words) in enumerate(zip(methods, shown)):
        body.append(_pair(20 + slot * (j + 0.5), name, (tokens, cost, speed), words, y_of))
    if any(float(cost) < 1 for _, cost in shown):  # a cost printed under 1
        body.append(text(PAYS_W / 2, PAYS_H - 12, f"a grey bar under 1: {UNDER_ONE}", 22, REJECTED_TEXT))
    return (f'<svg width="{PAYS_W}" height="{PAYS_H}" viewBox="0 0 {PAYS_W} {PAYS_H}" role="img" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif">{"".join(body)}</svg>')


def _pair(centre: float, name: str, figures: tuple[float, float, float], words: tuple[str, str], y_of) -> str:
    """One method's two bars, their values on top (`words`: as printed), its speed above them and its name below."""
    (tokens, cost, speed), bar, gap, floor = figures, 74, 14, PLOT[1]
    (shown_tokens, shown_cost), parts = words, []
    for x, value, colour, shown in ((centre - gap / 2 - bar, tokens, ACCEPTED_COLOUR, shown_tokens),
                                    (centre + gap / 2, cost, COST_COLOUR, shown_cost)):
        parts.append(f'<rect x="{x:.0f}" y="{y_of(value):.0f}" width="{bar}" height="{floor - y_of(value):.0f}" '
                     f'rx="4" fill="{colour}"/>')
        parts.append(text(x + bar / 2, y_of(value) - 14, shown, 22, INK))
    colour = ACCEPTED_COLOUR if speed >= 1.05 else LOSS_COLOUR if speed <= 0.95 else INK  # as the page's meter
    parts.append(text(centre, y_of(max(tokens, cost)) - 50, f"{speed:.2f}×", 30, colour, bold=True))  # above both
    parts += [text(centre, floor + 24 + 24 * i, line, 22, INK) for i, line in enumerate(wrapped(name, 34)[:1])]
    return "".join(parts)
