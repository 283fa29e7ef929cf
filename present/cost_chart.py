"""The tour's last picture: what a step of N tokens costs on this machine, t(N)/t(1) in plain steps as the meter
timed it, with this step's tokens standing above or below its cost (present/tour.py's "What it bought")."""
from __future__ import annotations

import math

from .chart import tick_step
from .style import ACCEPTED_COLOUR, REJECTED_TEXT
from .tour_pictures import INK, SMALL, UNDER_ONE, VISIBLY_UNDER_ONE, svg, text, tile_box, wrapped

CHART = (90, 40, 700, 360)  # the cost chart's plot area: left, top, right, bottom (px)


def cost_chart_svg(costs: list[tuple[int, float]], step: tuple[int, int], tile: tuple[str, str], footer: str) -> str:
    """A step's cost against its size, and what one step gained, beside the answer's figure (a tile).

    `costs`: (tokens in one forward N, its cost in plain steps t(N)/t(1)), as the meter timed them, plain decoding's
    own step (1, 1.0) among them; `step`: (this step's N, the tokens it gained), drawn as a green bar from its
    cost up to its tokens: the step pays where the bar stands above the grey curve."""
    left, top, right, bottom = CHART
    n_max = max([n for n, _ in costs] + [step[0], 2])
    y_max = max([c for _, c in costs] + [step[1], 2.0]) * 1.12
    y_max = math.ceil(y_max / tick_step(y_max, 4)) * tick_step(y_max, 4)  # a tick above the tallest point
    x_of = lambda n: left + (right - left) * (n - 1) / max(n_max - 1, 1)  # noqa: E731
    y_of = lambda v: bottom - (bottom - top) * v / y_max  # noqa: E731
    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{INK}" stroke-width="2"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="{INK}" stroke-width="2"/>']
    dy = tick_step(y_max, 4)
    for j in range(int(y_max / dy) + 1):
        y = y_of(j * dy)
        body.append(f'<line x1="{left}" y1="{y:.0f}" x2="{right}" y2="{y:.0f}" stroke="#e2e8f0" stroke-width="1"/>')
        body.append(text(left - 12, y, f"{j * dy:g}", SMALL, REJECTED_TEXT, "end"))
    for n in size_ticks(n_max):
        body.append(text(x_of(n), bottom + 22, str(n), SMALL, REJECTED_TEXT))
    body.append(text((left + right) / 2, bottom + 52, "tokens checked in one forward (N)", SMALL, INK))
    mid = (top + bottom) / 2  # the y axis: a step's time and its tokens, both counted in plain steps
    body.append(f'<g transform="rotate(-90 {left - 58} {mid:.0f})">{text(left - 58, mid, "plain steps", SMALL, INK)}</g>')
    points = sorted(costs)
    dash = ' stroke-dasharray="8 7"'  # between sizes not timed
    body += [f'<line x1="{x_of(a):.0f}" y1="{y_of(ca):.0f}" x2="{x_of(b):.0f}" y2="{y_of(cb):.0f}" stroke="#64748b" '
             f'stroke-width="3"{dash if b - a > 1 else ""}/>' for (a, ca), (b, cb) in zip(points, points[1:])]
    body += [f'<circle cx="{x_of(n):.0f}" cy="{y_of(c):.0f}" r="5" fill="#64748b"/>' for n, c in points]
    n, gained = step
    cost = dict(points).get(n)
    x = x_of(n)
    room_right = x + 260 < right + 60
    if cost is not None:
        body.append(f'<line x1="{x:.0f}" y1="{y_of(cost):.0f}" x2="{x:.0f}" y2="{y_of(gained):.0f}" '
                    f'stroke="{ACCEPTED_COLOUR}" stroke-width="6"/>')
        body.append(cost_label(x, y_of(cost), cost, step_box(x, y_of(gained), room_right)))
    body.append(f'<circle cx="{x:.0f}" cy="{y_of(gained):.0f}" r="11" fill="{ACCEPTED_COLOUR}"/>')
    body.append(step_label(x, y_of(gained), gained, cost, room_right=room_right))
    gaps = any(b - a > 1 for (a, _), (b, _) in zip(points, points[1:]))
    body.append(text(left + 8, top - 22, "grey: a step's time ÷ a plain step's"
                     + ("; dashed: not timed" if gaps else ""), SMALL, "#475569", "start"))
    printed = cost is not None and n > 1 and round(cost, 2) < 1  # "cost 0.97" under the step's point
    if printed or any(c < VISIBLY_UNDER_ONE for n, c in points if n > 1):  # CPUs whose one-row product is slower
        body.append(text(left + 8, bottom + 92, f"under 1: {UNDER_ONE}", SMALL, "#475569", "start"))
    body.append(tile_box(790, 40, 370, 320, *tile))
    body += [text(975, 388 + 28 * i, line, SMALL, INK) for i, line in enumerate(wrapped(footer, 30)[:2])]
    return svg("".join(body))


def cost_label(x: float, y: float, cost: float, step_box: tuple[float, float, float, float]) -> str:
    """"cost 2.98" beside the step's point on the grey curve: above left where it fits, else below right (where a
    rising curve never runs), below left or above right; never over the step's own label (`step_box`: x0, y0, x1,
    y1) nor past the plot (a reader saw it meet the dashed line under the point)."""
    label, (left, top, right, bottom) = f"cost {cost:.2f}", CHART
    w, h = 0.58 * SMALL * len(label), SMALL + 6  # the label's box, estimated
    spots = ((x - 14 - w, y - 20), (x + 14, y + 24), (x - 14 - w, y + 24), (x + 14, y - 20))  # (box left, centre y)

    def fits(x0: float, cy: float) -> bool:
        sx0, sy0, sx1, sy1 = step_box
        inside = left + 4 <= x0 and x0 + w <= right + 70 and top <= cy - h / 2 and cy + h / 2 <= bottom - 4
        return inside and (x0 + w < sx0 or x0 > sx1 or cy + h / 2 < sy0 or cy - h / 2 > sy1)

    x0, cy = next((spot for spot in spots if fits(*spot)), spots[0])
    return text(x0, cy, label, SMALL, "#475569", "start", halo=True)


def step_box(x: float, y: float, room_right: bool) -> tuple[float, float, float, float]:
    """The box `step_label` fills (x0, y0, x1, y1), estimated: two lines of up to about 300 px."""
    return (x + 18, y - 22, x + 330, y + 40) if room_right else (x - 330, y - 22, x - 18, y + 40)


def step_label(x: float, y: float, gained: int, cost: float | None, room_right: bool) -> str:
    """This step's tokens beside its dot (right of it where it fits before the tile), and under them what the step
    alone gave: its tokens over its cost, as the page's cost panel says it (a reader missed it beside 0.63×)."""
    tx, anchor = (x + 18, "start") if room_right else (x - 18, "end")
    out = text(tx, y - 4, f"this step: {gained} token{'s' if gained != 1 else ''}", 24, ACCEPTED_COLOUR, anchor,
               bold=True, halo=True)
    if cost:
        out += text(tx, y + 24, f"alone ≈ {gained} ÷ {cost:.2f} = {gained / round(cost, 2):.2f}× plain", SMALL,
                    ACCEPTED_COLOUR, anchor, halo=True)
    return out


def size_ticks(n_max: int) -> list[int]:
    """The cost chart's sizes ticked: 1, round steps, and the largest size timed (a reader read 81 tokens plotted at
    the tick "80"), in place of a round step too close to it."""
    dx = tick_step(n_max - 1, 6)
    ticks = sorted({1, *range(dx, n_max + 1, dx)})
    if ticks[-1] != n_max:
        ticks = ticks[:-1] + [n_max] if n_max - ticks[-1] < dx / 2 else ticks + [n_max]
    return ticks
