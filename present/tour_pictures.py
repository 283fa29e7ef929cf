"""The tour's pictures (present/tour.py) as SVG: 1200x470, no text under 22 px, every label escaped.

Bars of candidates, rows of chips (the matrix), a chain of chips (the accepted path), figure tiles, and the draft
tree laid out left to right (depth across, siblings down: a tree is wider than deep on a 16:9 screen).
"""
from __future__ import annotations

import html
import textwrap
from collections import Counter
from typing import Callable

from tr_core.events import StepEvent
from tr_core.verify import path_to

from .nodes import draft_sources, node_group, node_source
from .style import (ACCEPTED_COLOUR, BONUS_COLOUR, MARK_COLOUR, PAST_END_COLOUR, REJECTED_COLOUR, REJECTED_TEXT,
                    ROOT_COLOUR, fit_token, text_em, visible_token)
from .tree_layout import tree_layout

W, H = 1200, 470
SMALL = 22  # px: the smallest text of a picture (the tour's rule is 20)
INK = "#0f172a"
UNDER_ONE = "a step of a few tokens took less time than a plain step here"  # what a cost under 1 means (measured)
VISIBLY_UNDER_ONE = 0.97  # a cost the chart draws visibly under 1 (one plain step), or prints under 1: its note
# says why (a reader found the note beside a curve that touched 1 at 0.99 and stood nowhere visibly under it;
# another a point at 0.95 under 1 with no note; another the step's "cost 0.97" with none)
DRAFT = "#334155"  # a draft before the verdict
ROOT_X = 110  # the root's x in a tree picture (its label stands left of it)
MASK_NODES = 14  # nodes the attention-mask picture shows at most (a cell of 24 px)
MASK_W = 450  # px of the mask picture: 14 rows of 24 px, each labelled with its token in 22 px type
MAX_LEVELS = 7  # tree levels a picture draws (the labels of more would not fit 20 px type across 1200 px)
SOURCE_WORDS = {"matrix": "from the matrix", "context": "copied", "both": "both"}  # the studio's tree legend's
# words (present/tree.py SOURCE_NAMES), short: a legend line holds them beside the verdict's colours, after "shape:"
PATH_TOP = 80  # a tree's top when the accepted path is written out above it (narrow columns beside the mask)


def svg(body: str, height: int = H) -> str:
    return (f'<svg width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
            f'role="img" font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif">{body}</svg>')


def text(x: float, y: float, s: str, size: int = 24, fill: str = INK, anchor: str = "middle", bold: bool = False,
         halo: bool = False) -> str:
    """A label; `halo`: a white outline under the glyphs, so lines it sits on do not cross it."""
    extra = (' font-weight="700"' if bold else "") + (
        ' stroke="#ffffff" stroke-width="7" stroke-linejoin="round" paint-order="stroke"' if halo else "")
    return (f'<text x="{x:.0f}" y="{y:.0f}" font-size="{max(size, SMALL)}" fill="{fill}" text-anchor="{anchor}" '
            f'dominant-baseline="central"{extra}>{html.escape(s)}</text>')


def chip(x: float, y: float, w: float, h: float, label: str, fill: str = "#f1f5f9", ink: str = INK,
         stroke: str = REJECTED_COLOUR, stroke_w: int = 2, size: int = 24) -> str:
    return (f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="10" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{stroke_w}"/>' + text(x + w / 2, y + h / 2, label, size, ink))


def bars_svg(rows: list[tuple[str, float | None, bool]]) -> str:
    """Candidates as bars, best first: (token, probability or None, kept by plain decoding)."""
    rows = rows[:8]
    rh = min(56, (H - 20) // max(len(rows), 1))
    body = []
    for j, (label, p, kept) in enumerate(rows):
        y = 10 + j * rh
        colour = ACCEPTED_COLOUR if kept else REJECTED_COLOUR
        body.append(chip(0, y + 4, 200, rh - 8, visible_token(label, 10), stroke=colour, stroke_w=3 if kept else 2))
        width = 760 * (p if p is not None else 1.0)
        body.append(f'<rect x="220" y="{y + 8}" width="{max(width, 4):.0f}" height="{rh - 16}" rx="6" fill="{colour}"/>')
        if p is not None:
            body.append(text(232 + width, y + rh / 2, "<1%" if p < 0.005 else f"{p:.0%}", 24, INK, "start"))
        body.append(text(1195, y + rh / 2, "✓ kept" if kept else "✗", 26, ACCEPTED_COLOUR if kept else REJECTED_TEXT,
                         "end", bold=kept))
    return svg("".join(body))


def rows_svg(rows: list[tuple[str, list[tuple[str, bool]]]], more: int, labels: list[str] | None = None,
             key: str = "") -> str:
    """Matrix rows: the row's token, then its candidate chips (outlined: drafted, or new when `labels` are
    before/after lines of one row, as `key` says above them); `more` rows not shown are counted below."""
    line_h = 100 if labels else 95
    top = max(50, (H - line_h * len(rows) - (40 if more else 0)) // 2)
    body = [text(0, top - 30, key, SMALL, REJECTED_TEXT, "start")] if key else []
    for j, (row, chips) in enumerate(rows):
        y = top + j * line_h + (26 if labels else 10)
        if labels:
            body.append(text(0, y - 16, labels[j], SMALL, REJECTED_TEXT, "start"))
        body.append(chip(0, y, 190, 64, f"{visible_token(row, 7)} →", ROOT_COLOUR, "white", ROOT_COLOUR))
        for c, (label, marked) in enumerate(chips[:8]):
            body.append(chip(206 + c * 124, y, 114, 64, visible_token(label, 7), "#ffffff" if marked else "#f1f5f9",
                             INK, (MARK_COLOUR if labels else ROOT_COLOUR) if marked else REJECTED_COLOUR,
                             5 if marked else 2, 24))
    if more:
        body.append(text(600, top + line_h * len(rows) + 20, f"+ {more} more rows read", SMALL, REJECTED_TEXT))
    return svg("".join(body))


CHIP_FONT, CHIP_PAD = 28, 32  # px: a chain chip's text, and the room around it


def chips_svg(chips: list[tuple[str, str, str]], sum_line: str) -> str:
    """A chain of chips (token, fill, ink), seven a line, and a sum below."""
    per, h, gap = 7, 72, 18
    lines = [chips[i : i + per] for i in range(0, len(chips), per)] or [[]]
    top = (H - len(lines) * (h + 30) - 60) // 2
    body = []
    for j, line in enumerate(lines):
        labels, widths = chip_labels([label for label, _, _ in line], gap)
        x = (W - sum(widths) - (len(line) - 1) * gap) / 2
        for (_, fill, ink), label, w in zip(line, labels, widths):
            body.append(chip(x, top + j * (h + 30), w, h, label, fill, ink, fill, 2, CHIP_FONT))
            x += w + gap
    body.append(text(W / 2, top + len(lines) * (h + 30) + 36, sum_line, 34, INK, bold=True))
    return svg("".join(body))


def chip_labels(tokens: list[str], gap: int, least: int = 150, most_em: float = 9.0) -> tuple[list[str], list[int]]:
    """A line of chips' labels and widths: each token whole where its chip (at least `least` px) lets the line fit
    the picture, else every label cut to a `least`-px chip (fit_token: '…')."""
    labels = [fit_token(t, most_em) for t in tokens]
    widths = [max(least, round(text_em(label) * CHIP_FONT) + CHIP_PAD) for label in labels]
    if sum(widths) + gap * (len(tokens) - 1) <= W - 40:
        return labels, widths
    return [fit_token(t, (least - CHIP_PAD) / CHIP_FONT) for t in tokens], [least] * len(tokens)


def message_svg(message: str) -> str:
    """One sentence in large type, centred (a picture that says why there is none)."""
    lines = wrapped(message, 48)
    top = H / 2 - (len(lines) - 1) * 22
    return svg("".join(text(W / 2, top + i * 44, s, 32, REJECTED_TEXT) for i, s in enumerate(lines)))


def tiles_svg(tiles: list[tuple[str, str]], footer: str) -> str:
    """Figure tiles (big figure, what it is) side by side, and a line below (the machine that timed them)."""
    w, gap = 370, 45
    left = (W - len(tiles) * w - (len(tiles) - 1) * gap) / 2
    body = []
    for j, (big, small) in enumerate(tiles):
        body.append(tile_box(left + j * (w + gap), 30, w, 320, big, small))
    body.append(text(W / 2, 410, footer[:90], 24, INK))
    return svg("".join(body))


def tile_box(x: float, y: float, w: float, h: float, big: str, small: str) -> str:
    """A figure tile: a big figure and what it is, wrapped below it (up to six lines: the figure moves up for
    more than four)."""
    lines = wrapped(small, 28)[:6]
    big_y, gap = (y + 110, 30) if len(lines) <= 4 else (y + 72, 27)
    parts = [f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="16" fill="#f8fafc" '
             f'stroke="{REJECTED_COLOUR}" stroke-width="2"/>',
             text(x + w / 2, big_y, big, min(64, int((w - 40) / (0.62 * max(len(big), 1)))), ROOT_COLOUR, bold=True)]
    parts += [text(x + w / 2, big_y + 85 + i * gap, line, SMALL, REJECTED_TEXT) for i, line in enumerate(lines)]
    return "".join(parts)


def wrapped(s: str, width: int) -> list[str]:
    """Lines of at most `width` characters, broken between words only."""
    return textwrap.wrap(s, width, break_long_words=False, break_on_hyphens=False)


def shape(source: str, x: float, y: float, fill: str, r: float = 11) -> str:
    """A node's marker: circle (the matrix), square (copied), diamond (both); the root a larger circle."""
    paint = f'fill="{fill}"'
    if source == "context":
        return f'<rect x="{x - r:.0f}" y="{y - r:.0f}" width="{2 * r:.0f}" height="{2 * r:.0f}" {paint}/>'
    if source == "both":
        d = r * 1.35
        return f'<polygon points="{x:.0f},{y - d:.0f} {x + d:.0f},{y:.0f} {x:.0f},{y + d:.0f} {x - d:.0f},{y:.0f}" ' \
               f'{paint}/>'
    return f'<circle cx="{x:.0f}" cy="{y:.0f}" r="{r + (4 if source == "root" else 0):.0f}" {paint}/>'


def swatch(x: float, y: float, fill: str) -> str:
    """A colour's legend key: a short thick stroke of no shape (a colour says the verdict, never where from)."""
    return f'<rect x="{x - 13:.0f}" y="{y - 6:.0f}" width="26" height="12" rx="4" fill="{fill}"/>'


def mask_labels(texts: list[str]) -> list[str]:
    """A mask row's label: its token, numbered where the same token stands on several rows ("↵·1", "↵·2")."""
    counts, seen = Counter(texts), Counter()
    out = []
    for t in texts:
        seen[t] += 1
        out.append(f"{visible_token(t, 4)}·{seen[t]}" if counts[t] > 1 else visible_token(t, 6))
    return out


def mask_svg(ev: StepEvent, token_text: Callable[[int], str], left: float, width: float = 360) -> str:
    """The tree attention mask of the step's forward: a row filled where its node sees the column's (itself and its
    ancestors; every node also sees the whole committed context), in its node's verdict colour (green: on the
    accepted path, grey: rejected, as the tree beside it). Rows and columns level by level, top to bottom
    within a level as the tree picture draws them; at most MASK_NODES; rows labelled with their tokens where a row
    is tall enough for 22 px type."""
    n = min(len(ev.tokens), MASK_NODES)
    labelled = (width - 110) / max(n, 1) >= 24
    grid = left + (110 if labelled else 0)
    cell = min(26.0, (width - (110 if labelled else 10)) / max(n, 1))
    top = 70
    some = f", first {n} of {len(ev.tokens)}" if len(ev.tokens) > n else ""  # said at the top, clear of the legend
    body = [text(left, 24, f"attention mask{some}: a row sees", SMALL, INK, "start"),
            text(left, 50, "itself and its ancestors (filled)", SMALL, INK, "start")]
    x = tree_layout(tuple(ev.parents), tuple(ev.ranks)).x  # rows level by level, each level as the tree draws it
    order = sorted(range(len(ev.tokens)), key=lambda i: (ev.depths[i], x[i]))[:n]
    on_path, labels = set(ev.accepted), mask_labels([token_text(ev.tokens[i]) for i in order])
    for r, i in enumerate(order):
        seen = set(path_to(ev.parents, i))  # itself and its ancestors
        if labelled:
            body.append(text(grid - 8, top + (r + 0.5) * cell, labels[r], SMALL, INK, "end"))
        for c, j in enumerate(order):
            fill = (ACCEPTED_COLOUR if i in on_path else REJECTED_COLOUR) if j in seen else "#ffffff"
            body.append(f'<rect x="{grid + c * cell:.1f}" y="{top + r * cell:.1f}" width="{cell - 1:.1f}" '
                        f'height="{cell - 1:.1f}" fill="{fill}" stroke="#e2e8f0"/>')
    return "".join(body)


def tree_svg(ev: StepEvent, token_text: Callable[[int], str], verdict: bool, mask: bool = False) -> str:
    """The step's draft tree, depth across: markers by source; with `verdict`, the accepted path green, the rest
    grey, and the bonus token as an amber star after the path. A level's labels never touch (LABEL_GAP: the
    path's first, then the likelier drafts; beside the mask, a few letters wide, the path's alone), and its markers
    shrink to fit (the paper's 80 nodes); levels past
    MAX_LEVELS are counted at the end of the path, not drawn (a long copied run)."""
    levels, groups, on_path = min(max(ev.depths, default=0), MAX_LEVELS), node_group(ev), set(ev.accepted)
    shown, counts = folded(ev, [i for i in range(len(ev.tokens)) if ev.depths[i] <= levels],
                           on_path if verdict else set())
    marks = {} if verdict else counts  # beside the verdict's path, one total (a branch's count split along it)
    tail = verdict and (ev.bonus is not None or levels < max(ev.depths, default=0))
    span = max([ev.depths[i] for i in shown] + [ev.depths[a] + 1 for a in marks])  # the columns drawn
    col = min(380.0, (540.0 if mask else 930.0) / max(span + tail, 1))
    chars = max(3, min(12, int((col - 40) / 14.5)))  # bold path labels run about 14 px a character
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks), SPREAD)
    narrow = chars < 5  # a column of a few letters (the paper's tree beside the mask): the path's labels only
    # and the path written out whole above the tree (where every level is drawn: else "+ n more accepted" ends it)
    strip = verdict and narrow and len(ev.accepted) > 1 and levels == max(ev.depths, default=0)
    top = PATH_TOP if strip else 30
    xy = {i: (ROOT_X + ev.depths[i] * col, top + layout.x[i] * (400 - top)) for i in shown}
    path = set(on_path) if verdict else set()
    body = [f'<line x1="{xy[ev.parents[i]][0]:.0f}" y1="{xy[ev.parents[i]][1]:.0f}" x2="{xy[i][0]:.0f}" '
            f'y2="{xy[i][1]:.0f}" stroke="{ACCEPTED_COLOUR if i in path else REJECTED_COLOUR}" '
            f'stroke-width="{5 if i in path else 2}"/>' for i in shown if i]
    body.append(path_end(ev, token_text, xy, col, chars, verdict, named=not strip, folded=sum(counts.values())))
    body += [text(x + col, y, f"+{n}", SMALL, REJECTED_TEXT, "middle") for x, y, n in count_marks(marks, xy)]
    if counts and verdict:
        body.append(text(20, 418, f"+ {sum(counts.values())} more drafts, not drawn", SMALL, REJECTED_TEXT, "start"))
    r = marker_radius([xy[i][1] for i in shown if i], [ev.depths[i] for i in shown if i])
    body += [shape("root" if i == 0 else node_source(ev, i) or "matrix", *xy[i], node_fill(groups[i], verdict),
                   11 if i in path or i == 0 else r)
             for i in sorted(shown, key=lambda i: i in path)]  # the path's markers over the rest
    over = xy[0][1] - 34 >= top - 14  # over the root, where ten letters fit (left of it, five were cut at the edge);
    body.append(text(ROOT_X, xy[0][1] + (-34 if over else 34), visible_token(token_text(ev.tokens[0]), 10), SMALL,
                     INK, "middle", True, True))  # under it where it stands at the top
    if strip:
        body.append(path_strip(ev, token_text, (W - MASK_W - 40) if mask else W - 40))
    named = {} if strip else {i: p for i, p in xy.items() if i in path or not (verdict and narrow)}  # the strip says
    for i in labelled_nodes(ev, named, path):
        ink = REJECTED_TEXT if verdict and groups[i] == "rejected" else INK
        body.append(text(xy[i][0] + 18, xy[i][1], visible_token(token_text(ev.tokens[i]), chars), 22, ink, "start",
                         i in path, True))
    body.append(tree_legend(ev, verdict and levels == max(ev.depths, default=0), verdict, bool(marks)))
    if mask:
        body.append(mask_svg(ev, token_text, W - MASK_W - 10, MASK_W))
    return svg("".join(body))


def path_strip(ev: StepEvent, token_text: Callable[[int], str], width: float) -> str:
    """The accepted path written out above a tree whose columns are too narrow to name it: its tokens in order,
    then the bonus (★), in bold green, on at most two lines of `width` px."""
    words = [visible_token(token_text(ev.tokens[i]), 12) for i in ev.accepted[1:]]
    if ev.bonus is not None:
        words.append(f"+ ★ {visible_token(token_text(ev.bonus), 12)}")
    lines = wrapped("accepted: " + "  ".join(words), int(width / 12.5))[:2]
    return "".join(text(20, 22 + 27 * j, line, SMALL, ACCEPTED_COLOUR, "start", True) for j, line in enumerate(lines))


FOLD_OVER, FOLD_DEPTH = 40, 2  # a tree of more nodes draws its first FOLD_DEPTH levels and its path, the rest counted


def folded(ev: StepEvent, shown: list[int], path: set[int]) -> tuple[list[int], dict[int, int]]:
    """(the nodes drawn, {drawn node: its drafts not drawn}): `shown` whole for a small tree; for one of more than
    FOLD_OVER nodes (the paper's 80: its deep levels merged into bars of markers), the first FOLD_DEPTH levels and
    `path`, every other draft counted at its nearest drawn ancestor ("+12" where its branch goes on)."""
    if len(shown) <= FOLD_OVER:
        return shown, {}
    keep = [i for i in shown if ev.depths[i] <= FOLD_DEPTH or i in path]
    kept, counts = set(keep), {}
    for i in shown:
        if i not in kept:
            a = ev.parents[i]
            while a not in kept:
                a = ev.parents[a]
            counts[a] = counts.get(a, 0) + 1
    return keep, counts


def count_marks(counts: dict[int, int], xy: dict) -> list[tuple[float, float, int]]:
    """(x, y, n) of the "+n" marks, one per branch, or one for neighbouring branches of a level closer than
    LABEL_GAP (their counts summed at the first)."""
    marks: list[list] = []
    for a in sorted(counts, key=lambda a: xy[a]):
        x, y = xy[a]
        if marks and marks[-1][0] == x and y - marks[-1][3] < LABEL_GAP:
            marks[-1][2] += counts[a]
            marks[-1][3] = y
        else:
            marks.append([x, y, counts[a], y])
    return [(x, y, n) for x, y, n, _ in marks]


LABEL_GAP = 25  # px between two labels of one level: 22 px type that does not touch its neighbour's
SPREAD = 0.5  # a subtree's share of its parent's band: leaves ** SPREAD (tree_layout; the root's 8 candidates of the
# paper's tree named: 3 of 8 were with shares by leaves)


def labelled_nodes(ev: StepEvent, xy: dict, path: set[int]) -> list[int]:
    """The drawn nodes (not the root) whose tokens are written beside them: in each level the path's node first,
    then the others in tree order (the likelier first), each at least LABEL_GAP from every label kept."""
    kept: dict[int, list[float]] = {}
    out = []
    for i in sorted((i for i in xy if i), key=lambda i: (i not in path, i)):
        ys = kept.setdefault(ev.depths[i], [])
        if all(abs(xy[i][1] - y) >= LABEL_GAP for y in ys):
            ys.append(xy[i][1])
            out.append(i)
    return out


def marker_radius(ys: list[float], depths: list[int]) -> float:
    """The drafts' marker radius: 11 px, or less where a level's nodes stand closer (never under 4 px)."""
    by_level: dict[int, list[float]] = {}
    for y, d in zip(ys, depths):
        by_level.setdefault(d, []).append(y)
    gaps = [b - a for level in by_level.values() for a, b in zip(sorted(level), sorted(level)[1:])]
    return max(4.0, min(11.0, min(gaps, default=30.0) / 2 - 1))


def path_end(ev: StepEvent, token_text: Callable[[int], str], xy: dict, col: float, chars: int,
             verdict: bool, named: bool = True, folded: int = 0) -> str:
    """What follows the drawn tree: before the verdict, how many deeper drafts are not drawn (past the levels
    drawn; `folded` others are counted beside their branches); after it, the accepted drafts past the last drawn
    level, then the bonus token (an amber star; `named`: its token beside it, not where the path is written out
    above the tree)."""
    deeper = sum(1 for i in range(len(ev.tokens)) if i not in xy) - folded
    if not verdict:
        last_y = max(y for _, y in xy.values())
        return text(W - 10, min(last_y + 40, 410), f"+ {deeper} deeper drafts, not drawn", SMALL, REJECTED_TEXT,
                    "end") if deeper else ""
    last = max((i for i in ev.accepted if i in xy), key=lambda i: ev.depths[i])
    x, y = xy[last]
    hidden = sum(1 for i in ev.accepted if i not in xy)
    if hidden:
        return (f'<line x1="{x:.0f}" y1="{y:.0f}" x2="{x + col:.0f}" y2="{y:.0f}" stroke="{ACCEPTED_COLOUR}" '
                f'stroke-width="5" stroke-dasharray="8 6"/>' +
                text(x + col - 10, y - 30, f"+ {hidden} more accepted", SMALL, ACCEPTED_COLOUR, "end", True, True))
    if ev.bonus is None:
        return ""
    sy = star_y(ev, last, xy)
    return (f'<line x1="{x:.0f}" y1="{y:.0f}" x2="{x + col:.0f}" y2="{sy:.0f}" stroke="{BONUS_COLOUR}" '
            f'stroke-width="4" stroke-dasharray="8 6"/>' + text(x + col, sy, "★", 40, BONUS_COLOUR) +
            (text(x + col + 20, sy, visible_token(token_text(ev.bonus), chars), 22, INK, "start", True, True)
             if named else ""))


STAR_CLEAR = 44  # px: the bonus star's distance from a drawn node of its column (a reader found it under one)


def star_y(ev: StepEvent, last: int, xy: dict) -> float:
    """The bonus star's height: level with the path's last drawn node, or where that spot holds a drafted node of
    the next level, the nearest height STAR_CLEAR from every such node (within the picture)."""
    y = xy[last][1]
    taken = [xy[i][1] for i in xy if ev.depths[i] == ev.depths[last] + 1]
    for offset in sorted({0.0, *(t - y + d for t in taken for d in (STAR_CLEAR, -STAR_CLEAR))}, key=abs):
        if 20 <= y + offset <= 400 and all(abs(y + offset - t) >= STAR_CLEAR for t in taken):
            return y + offset
    return y


def node_fill(group: str, verdict: bool) -> str:
    if group == "root":
        return ROOT_COLOUR
    if not verdict:
        return DRAFT
    return {"accepted": ACCEPTED_COLOUR, "past end": PAST_END_COLOUR}.get(group, REJECTED_COLOUR)


def tree_legend(ev: StepEvent, bonus_drawn: bool, verdict: bool, counted: bool = False) -> str:
    """One line under the tree, one rule: colour = the verdict (swatches: root, accepted, rejected; drafts not yet
    checked before the verdict; the amber star, the bonus), shape = where a draft came from ("shape:", then each
    shape filled in slate, as the drafts are drawn before the verdict: readers found no drawn node like an outline)."""
    items = [("swatch", ROOT_COLOUR, "root")]
    if verdict:
        items += [("swatch", ACCEPTED_COLOUR, "accepted"), ("swatch", REJECTED_COLOUR, "rejected")]
        if ev.bonus is not None and bonus_drawn:
            items.append(("star", BONUS_COLOUR, "bonus token"))
    elif len(ev.tokens) > 1:
        items.append(("swatch", DRAFT, "not checked yet"))
    if counted:
        items.append(("count", REJECTED_TEXT, "deeper drafts, not drawn"))
    first_shape = len(items)
    items += [(s, DRAFT, SOURCE_WORDS[s]) for s in draft_sources(ev)]
    body, x = [], 20.0
    for j, (key, fill, words) in enumerate(items):
        if j == first_shape:  # a shape says where a draft came from, whatever its colour
            body.append(text(x - 13, 445, "shape:", SMALL, INK, "start"))
            x += 84
        body.append(text(x, 445, "★", 32, fill) if key == "star" else swatch(x, 445, fill) if key == "swatch"
                    else text(x, 445, "+n", SMALL, fill) if key == "count" else shape(key, x, 445, fill, 10))
        body.append(text(x + 22, 445, words, SMALL, INK, "start"))
        x += 58 + len(words) * 11.5
    return "".join(body)
