"""A guided tour of one step, for a lecture: seven screens at 1280x720, each one idea, one large picture and at most
about thirty words, no text under 20 px. The same markup serves the studio (an overlay over the page) and the
offline HTML replay; TOUR_JS moves through it with the arrow keys, space, Home/End and Escape.

    screens = tour_screens(trace, telling_step(trace))   # data: title, picture (SVG), words
    markup = tour_html(trace, step)                       # the screens as one overlay (closed until TOUR_JS opens it)

Every string that comes from the trace is escaped: a trace may come from a stranger.
"""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from tr_core.events import StepEvent
from tr_core.trace import Trace

from .meter import drafting_words, machine_of
from .nodes import node_group, node_source
from .style import ACCEPTED_COLOUR, BONUS_COLOUR, REJECTED_COLOUR, ROOT_COLOUR, symbol_note, visible_token
from .cost_chart import cost_chart_svg
from .tour_pictures import bars_svg, chips_svg, message_svg, rows_svg, tiles_svg, tree_svg

TokenText = Callable[[int], str]
MAX_WORDS = 30  # a screen's words: its caption (the picture carries tokens and figures, the title four to six words)
# where drafts came from, as the tree's legend says it (present/tour_pictures.py SOURCE_WORDS, shorter)
SOURCES = (("matrix", "from matrix rows"), ("both", "in a row and copied"), ("context", "copied"))
ROWS_SHOWN = 4  # matrix rows a screen shows at most (their chips stay readable from the back row)
MIN_STEPS = 3  # the cost curve's sizes: those the meter timed at least this often (one or two steps are noise)


@dataclass(frozen=True)
class Screen:
    """One screen of the tour: a title, one picture (SVG markup, escaped) and a caption of at most MAX_WORDS."""

    title: str
    picture: str
    words: str


def q(text: str, max_len: int = 10) -> str:
    """A token as the captions quote it (not escaped yet): “␣the”."""
    return f"“{visible_token(text, max_len)}”"


def matrix_kept(ev: StepEvent) -> int:
    """How many drafts the answer kept that came from matrix rows alone (not copies, nor copies a row agreed with):
    the paper's method at work."""
    groups = node_group(ev)
    return sum(1 for i in ev.accepted[1:] if groups[i] == "accepted" and (node_source(ev, i) or "matrix") == "matrix")


def telling_step(trace: Trace) -> int:
    """The step a tour shows unless told otherwise: one whose kept drafts came from matrix rows (the paper's method
    at work), the most of them, then one whose first screen can show the root's own top 8 (`root_row_is_its_own`),
    then one whose verdict turned a draft down (a chain the model took whole shows no
    verdict), then the most tokens, the biggest tree, the latest; 0 for a trace without steps."""
    return telling_index(trace.steps)


def telling_index(steps: list[StepEvent]) -> int:
    """`telling_step` of a list of steps (the side-by-side's cards draw theirs by the same rule)."""
    if not steps:
        return 0
    return max(range(len(steps)), key=lambda i: (matrix_kept(steps[i]), root_row_is_its_own(steps[i]),
                                                 len(steps[i].tokens) > len(steps[i].accepted),
                                                 len(steps[i].emitted), len(steps[i].tokens), i))


def root_row_is_its_own(ev: StepEvent) -> bool:
    """Whether the row the step wrote for the root's token holds the root's own candidates: it does unless the
    token stands at another node of the tree too (a row is written once per distinct token, by one of its nodes)."""
    return ev.tokens[0] in ev.matrix_rows and ev.tokens[0] not in ev.tokens[1:]


def root_candidates(ev: StepEvent) -> list[tuple[int, float | None]]:
    """The root's candidates from this step's forward, best first (the root token's row as the step wrote it);
    the model's own pick alone when the step wrote no row for it, or the row may be another node's."""
    root = ev.tokens[0]
    if root_row_is_its_own(ev):
        j = ev.matrix_rows.index(root)
        probs = ev.matrix_probs[j] if j < len(ev.matrix_probs) else [None] * len(ev.matrix_values[j])
        return [(t, p) for t, p in zip(ev.matrix_values[j], probs)]
    pick = ev.choices[0] if ev.choices else ev.emitted[0]
    return [(pick, None)]


def model_pick(ev: StepEvent) -> int:
    """The token the model chose after the root: what plain decoding keeps."""
    return ev.choices[0] if ev.choices else ev.emitted[0]


def plain_screen(ev: StepEvent, text: TokenText) -> Screen:
    cands = root_candidates(ev)
    pick = model_pick(ev)
    rows = [(text(t), p, t == pick) for t, p in cands]
    return Screen("Plain decoding keeps one token", bars_svg(rows),
                  f"In this step's forward the model scored every token after {q(text(ev.tokens[0]))} (its top "
                  f"{len(cands)} here). Plain decoding keeps {q(text(pick))} and throws the others away.")


def read_rows(ev: StepEvent) -> list[tuple[int, list[int]]]:
    """The matrix rows this step's draft read, as they were before it (at most ROWS_SHOWN), root's first."""
    return [(row, list(values)) for row, values in zip(ev.rows_read, ev.rows_read_values)][:ROWS_SHOWN]


def drafted_after(ev: StepEvent) -> dict[int, set[int]]:
    """Per parent token: the tokens the tree drafted after it (a row's chips that became drafts)."""
    out: dict[int, set[int]] = {}
    for i in range(1, len(ev.tokens)):
        out.setdefault(ev.tokens[ev.parents[i]], set()).add(ev.tokens[i])
    return out


def matrix_screen(ev: StepEvent, text: TokenText, k: int) -> Screen:
    rows = read_rows(ev)
    title = "The matrix kept earlier candidates"
    if not rows:
        why = ("its drafts were all copied from the conversation" if any(
            node_source(ev, i) == "context" for i in range(1, len(ev.tokens))) else "it drafted nothing")
        return Screen(title, message_svg(f"This step read no matrix row: {why}."),
                      f"Row “t” of the adjacency matrix holds the {k} candidates last seen after “t”. This step read "
                      "none; pick another step to see rows read.")
    used = drafted_after(ev)
    shown = [(text(row), [(text(t), t in used.get(row, set())) for t in values]) for row, values in rows]
    more = len(ev.rows_read) - len(rows)
    root = q(text(ev.tokens[0]))
    return Screen(title, rows_svg(shown, more, key="as an earlier forward left them (screen 1: this one's) · outlined: drafted now"),
                  f"Row {root} holds the model's top {k} after {root}, from the last forward that scored it. This "
                  f"step read {len(ev.rows_read)} such row{'s' if len(ev.rows_read) != 1 else ''}; screen 6 "
                  "shows one it writes back.")


def tree_screen(ev: StepEvent, text: TokenText) -> Screen:
    title, drafts = "A draft tree from the matrix", len(ev.tokens) - 1
    if drafts == 0:
        return Screen(title, tree_svg(ev, text, verdict=False),
                      f"This step drafted nothing after {q(text(ev.tokens[0]))}: a bigger tree would have cost more "
                      "than it was likely to win. Pick another step.")
    sources = Counter(node_source(ev, i) or "matrix" for i in range(1, len(ev.tokens)))
    where = ", ".join(f"{sources[s]} {words}" for s, words in SOURCES if sources[s])
    return Screen(title, tree_svg(ev, text, verdict=False),
                  f"From the last token {q(text(ev.tokens[0]))}, candidates of candidates form a tree: {drafts} "
                  f"drafts over {max(ev.depths)} levels: {where}.")


def verdict_screen(ev: StepEvent, text: TokenText) -> Screen:
    drafts, kept = len(ev.tokens) - 1, len(ev.accepted) - 1
    return Screen("One forward checks every branch", tree_svg(ev, text, verdict=True, mask=True),
                  f"All {drafts + 1} tokens go through the model in ONE forward; each sees the cached prefix and its "
                  f"ancestors. Green: the path it agrees with, {kept} draft{'s' if kept != 1 else ''} deep.")


def accepted_screen(ev: StepEvent, text: TokenText) -> Screen:
    chips = [(text(ev.tokens[0]), ROOT_COLOUR, "white")]
    kept = len(ev.emitted) - (ev.bonus is not None)
    chips += [(text(t), ACCEPTED_COLOUR, "white") for t in ev.emitted[:kept]]
    if ev.bonus is not None:
        chips.append((text(ev.bonus), BONUS_COLOUR, "#1f2937"))
    n = len(ev.emitted)
    bonus = " + 1 bonus" if ev.bonus is not None else ""
    sum_line = f"{kept} draft{'s' if kept != 1 else ''}{bonus} = {n} token{'s' if n != 1 else ''} for one forward"
    return Screen("The longest agreed path, plus a bonus", chips_svg(chips, sum_line),
                  "The model's own choice after the path comes free: the bonus token (amber). Plain decoding "
                  f"needs {n} forward{'s' if n != 1 else ''} for these {n} token{'s' if n != 1 else ''}.")


def written_row(ev: StepEvent) -> tuple[int, list[int] | None, list[int]] | None:
    """The row to show written back: one the draft read that the step changed, the most changed; else the most
    changed rewritten row known before; else the root's row after. (row, before or None, after)."""
    after = {row: list(v) for row, v in zip(ev.matrix_rows, ev.matrix_values)}
    before = [(row, values, read) for row, values, _, read in ev.rows_before_step() if row in after]
    if before:  # a row the draft read (as the screen before showed) that changed, the most changed
        row, values, _ = max(before, key=lambda r: (r[2] and r[1] != after[r[0]],
                                                    sum(a != b for a, b in zip(r[1], after[r[0]]))))
        return row, values, after[row]
    root = ev.tokens[0]
    return (root, None, after[root]) if root in after else None


def written_screen(ev: StepEvent, text: TokenText, k: int) -> Screen:
    title = "The rows are written back"
    shown = written_row(ev)
    if shown is None:
        return Screen(title, message_svg("This step wrote no matrix row."), "Plain steps of sampled answers may "
                      "write nothing back; pick another step.")
    row, before, after = shown
    lines = [] if before is None else [("before this step", [(text(t), False) for t in before])]
    lines.append(("after it", [(text(t), before is not None and t not in before) for t in after]))
    return Screen(title, rows_svg([(text(row), chips) for _, chips in lines], 0, labels=[lab for lab, _ in lines],
                                  key="outlined: new in the row"),
                  f"The forward scored every node anyway, so each tree token's row gets its fresh top-{k}: "
                  f"{len(ev.matrix_rows)} rows, one per distinct token of the {len(ev.tokens)}, recycled for later.")


def bought_screen(trace: Trace, ev: StepEvent) -> Screen:
    """What the step gained against what it cost: over the meter's cost curve where the meter timed the answer's
    steps by size, else in tiles (this step's tokens, its own time, the answer's figure)."""
    n, step_ms = len(ev.emitted), ev.timings.get("total", 0.0)
    speed = trace.speed or {}
    plain_tps = speed.get("plain_tps") if speed.get("trusted") else None
    plain_ms = 1000.0 / plain_tps if plain_tps else None
    machine = machine_of(trace)
    footer = f"Timed on {machine}" if machine else "Machine not recorded"
    timed = {int(size): (ms, steps) for size, ms, steps in speed.get("step_ms") or ()} if plain_ms else {}
    if timed:  # the meter's cost curve, this step's tokens over its cost, and the answer's figure
        costs = {1: 1.0, **{size: ms / plain_ms for size, (ms, steps) in timed.items()  # t(1): plain's own step
                            if size > 1 and (steps >= MIN_STEPS or size == len(ev.tokens))}}
        return Screen("What it bought", cost_chart_svg(sorted(costs.items()), (len(ev.tokens), n),
                                                       answer_tile(trace, speed), footer),
                      "A step pays when its tokens (green) stand above its cost in plain steps (grey), as the meter "
                      "timed both over this answer.")
    tiles = [(f"{n} token{'s' if n != 1 else ''}", f"this step, from one forward of {len(ev.tokens)} tokens")]
    if plain_ms:
        tiles.append((f"{step_ms / plain_ms:.1f}", "plain steps: what this step cost, timed alone"))
    else:
        tiles.append((f"{step_ms:.0f} ms", "this step's cost (plain decoding was not timed)"))
    tiles.append(answer_tile(trace, speed))
    return Screen("What it bought", tiles_svg(tiles, footer),
                  "A step pays when its tokens outnumber its cost in plain steps. The meter times both methods over "
                  "the same tokens, on the machine named above.")


def answer_tile(trace: Trace, speed: dict[str, Any]) -> tuple[str, str]:
    """The whole answer's figure: the meter's measured ratio and how tokens a step and a step's time make it (a
    speedup above tokens a step is a step faster than a plain one), else its tokens per step and why it was not
    timed."""
    per_step = sum(len(e.emitted) for e in trace.steps) / max(len(trace.steps), 1)
    if speed.get("trusted") and speed.get("ratio") and trace.steps:
        ratio = speed["ratio"]
        tokens, cost = step_figures(per_step, ratio)
        return f"{ratio:.2f}×", (f"as fast as plain decoding, measured: {tokens} tokens a step ÷ {cost} = "
                                 f"{ratio:.2f}×, as a step took on average {cost} of a plain step's time")
    return f"{per_step:.2f}", "tokens a step, the whole answer (its speed was not measured)"


def step_figures(per_step: float, ratio: float) -> tuple[str, str]:
    """Tokens a step and a step's mean time in plain steps (tokens a step ÷ the speedup), as the tile and the
    side-by-side's bars write them: the fewest digits with which the tokens shown ÷ the cost shown give the speedup
    shown back (readers divided 1.58 by 1.035 and got 1.53, 2.20 by 3.354 and got 0.66, against 1.52 and 0.65)."""
    cost, want = per_step / ratio, round(ratio, 2)
    for token_digits in (2, 3):
        tokens = f"{per_step:.{token_digits}f}"
        for digits in (2, 3, 4):
            shown = f"{cost:.{digits}f}"
            if float(shown) and round(float(tokens) / float(shown), 2) == want:
                return tokens, shown
    return f"{per_step:.2f}", f"{cost:.3f}"


def step_cost(per_step: float, ratio: float) -> str:
    """A step's mean time in plain steps as `step_figures` writes it."""
    return step_figures(per_step, ratio)[1]


def tour_screens(trace: Trace, step: int, token_text: TokenText | None = None) -> list[Screen]:
    """The seven screens of the tour of step `step` (clamped to the trace's steps); [] for a trace without steps."""
    if not trace.steps:
        return []
    ev = trace.steps[max(0, min(step, len(trace.steps) - 1))]
    text = token_text or trace.token_text
    k = int(trace.settings.get("k") or 8)
    return [plain_screen(ev, text), matrix_screen(ev, text, k), tree_screen(ev, text), verdict_screen(ev, text),
            accepted_screen(ev, text), written_screen(ev, text, k), bought_screen(trace, ev)]


def footer_note(trace: Trace, screen: Screen) -> str:
    """A screen's footer: which drafting made the answer (the paper's or not), then what its symbols mean."""
    return " · ".join(x for x in (drafting_words(trace), symbol_note([screen.picture, screen.words])) if x)


def tour_html(trace: Trace, step: int, token_text: TokenText | None = None) -> str:
    """The tour of step `step` as one overlay (closed: TOUR_JS opens it), or '' for a trace without steps."""
    screens = tour_screens(trace, step, token_text)
    if not screens:
        return ""
    i = max(0, min(step, len(trace.steps) - 1))
    sections = "".join(
        f'<section class="tr-tour-screen" data-screen="{j}"><h2>{html.escape(s.title)}</h2>'
        f'<div class="tr-tour-pic">{s.picture}</div><p class="tr-tour-words">{html.escape(s.words)}</p>'
        f'<span class="tr-tour-note">{html.escape(footer_note(trace, s))}</span></section>'
        for j, s in enumerate(screens))
    head = html.escape(f"Step {i + 1} of {len(trace.steps)}")
    return (f'<div class="tr-tour" role="dialog" aria-label="Guided tour of one step"><div class="tr-tour-stage">'
            f'{sections}<nav class="tr-tour-nav"><span class="tr-tour-step">{head}</span>'
            '<button type="button" class="tr-tour-prev" title="previous screen (←)">◀</button>'
            f'<span class="tr-tour-count">1 / {len(screens)}</span>'
            '<button type="button" class="tr-tour-next" title="next screen (→, space)">▶</button>'
            '<button type="button" class="tr-tour-close" title="close (Esc)">✕</button></nav></div></div>')


TOUR_CSS = f"""
.tr-tour {{position: fixed; inset: 0; z-index: 10000; background: #0f172a; display: none;
  align-items: center; justify-content: center; overflow: hidden}}
.tr-tour.tr-tour-open {{display: flex}}
.tr-tour-stage {{width: 1280px; height: 720px; flex: none; background: #ffffff; position: relative;
  transform-origin: center center; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #0f172a; box-sizing: border-box; padding: 28px 40px 0 40px}}
.tr-tour-screen {{display: none}}
.tr-tour-screen.tr-on {{display: block}}
.tr-tour-screen h2 {{font-size: 44px; line-height: 52px; margin: 0 0 14px 0; color: {ROOT_COLOUR}}}
.tr-tour-pic {{height: 470px; display: flex; align-items: center; justify-content: center}}
.tr-tour-words {{font-size: 28px; line-height: 36px; margin: 14px 0 0 0; color: #1e293b}}
.tr-tour-nav {{position: absolute; right: 24px; bottom: 14px; display: flex; gap: 10px; align-items: center;
  font-size: 22px}}
.tr-tour-nav button {{font-size: 22px; min-width: 52px; height: 44px; border-radius: 10px; cursor: pointer;
  border: 2px solid {REJECTED_COLOUR}; background: #f8fafc; color: #0f172a}}
.tr-tour-step, .tr-tour-count {{color: #475569; font-size: 22px}}
.tr-tour-note {{position: absolute; left: 40px; bottom: 20px; max-width: 760px; font-size: 22px; line-height: 25px;
  color: #475569}}  /* the drafting, then the symbols: a second line grows upward, clear of the controls */
"""

# One listener for every tour on the page (the studio redraws its tour; the replay makes one per step): clicks on a
# tour's buttons, and keys while one is open. `trTourOpen(el)` opens the tour inside `el` at its first screen.
TOUR_JS = """
(function () {
  if (window.trTourOpen) return;
  function open() { return document.querySelector('.tr-tour.tr-tour-open'); }
  function fit(t) {
    var s = Math.min(window.innerWidth / 1280, window.innerHeight / 720);
    t.querySelector('.tr-tour-stage').style.transform = 'scale(' + s + ')';
  }
  function show(t, j) {
    var screens = t.querySelectorAll('.tr-tour-screen'), n = screens.length;
    var i = Math.max(0, Math.min(n - 1, j));
    t.dataset.at = String(i);
    screens.forEach(function (el, k) { el.classList.toggle('tr-on', k === i); });
    t.querySelector('.tr-tour-count').textContent = (i + 1) + ' / ' + n;
  }
  function close(t) { t.classList.remove('tr-tour-open'); document.documentElement.classList.remove('tr-touring'); }
  window.trTourOpen = function (el) {
    var t = el && (el.classList.contains('tr-tour') ? el : el.querySelector('.tr-tour'));
    if (!t) return false;
    var other = open();
    if (other && other !== t) close(other);
    t.classList.add('tr-tour-open');
    document.documentElement.classList.add('tr-touring');
    fit(t); show(t, 0);
    return true;
  };
  document.addEventListener('click', function (e) {
    var b = e.target.closest ? e.target.closest('.tr-tour button') : null;
    if (!b) return;
    var t = b.closest('.tr-tour'), at = Number(t.dataset.at || 0);
    if (b.classList.contains('tr-tour-close')) close(t);
    else show(t, at + (b.classList.contains('tr-tour-next') ? 1 : -1));
  });
  document.addEventListener('keydown', function (e) {
    var t = open();
    if (!t || e.altKey || e.ctrlKey || e.metaKey) return;
    var at = Number(t.dataset.at || 0), n = t.querySelectorAll('.tr-tour-screen').length;
    var to = {ArrowRight: at + 1, ' ': at + 1, PageDown: at + 1, Enter: at + 1, ArrowLeft: at - 1, PageUp: at - 1,
              Backspace: at - 1, Home: 0, End: n - 1}[e.key];
    if (e.key === 'Escape') { close(t); e.preventDefault(); e.stopPropagation(); return; }
    if (to === undefined) return;
    e.preventDefault(); e.stopPropagation();
    show(t, to);
  }, true);
  window.addEventListener('resize', function () { var t = open(); if (t) fit(t); });
})();
"""
