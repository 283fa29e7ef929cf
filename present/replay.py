"""One answer as a single self-contained HTML file: a replay that works anywhere, offline, without the app.

The file holds plotly.js, the answer with each step's accepted run coloured, and per step the draft tree, the
adjacency-matrix window, the step story and the step under the microscope (the same builders as the studio:
tree.py, heatmap.py, story.py, microscope.py; the microscope's text blocks are drawn with textContent).
A slider, previous/next buttons and the arrow keys move them together. Nothing is fetched: no CDN, no fonts,
no images, and a Content-Security-Policy forbids any request. Every string from the trace is escaped (a trace
may come from a stranger); the per-step data sits in a JSON script block whose '<', '>' and '&' are escaped.
"""
from __future__ import annotations

import html
import json
from typing import Any, Callable

from .heatmap import MatrixTracker, heatmap_figure
from .meter import identity_words, machine_of, parting_text
from .tree import tree_figure
from .microscope import CSS as MICROSCOPE_CSS
from .microscope import explain, known_before, microscope_blocks, values_known
from .story import ended_by, step_story
from .tour import TOUR_CSS, TOUR_JS, telling_step, tour_html
from tr_core.trace import Trace

TokenText = Callable[[int], str]
TOUR_STEPS = 200  # steps whose guided tour a file holds (about 23 KB each), beside the telling step's
# No request of any kind: scripts and styles are inline, plotly's heatmaps draw through data: images.
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")
# The file works offline and sends nothing anywhere: no button may upload a figure (plotly.js names it
# "sendChartToCloud"; older versions "sendDataToCloud"), and no server is set to upload to.
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "showSendToCloud": False, "showEditInChartStudio": False,
                 "plotlyServerURL": "", "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud"]}


def replay_steps(trace: Trace, token_text: TokenText) -> list[dict[str, Any]]:
    """Per step: the tree and matrix-window figures (plotly JSON), the story, the tokens emitted and the step under
    the microscope (its text blocks, present.microscope, drawn by the page's script with textContent)."""
    tracker = MatrixTracker()
    out = []
    for i, (ev, known) in enumerate(zip(trace.steps, known_before(trace))):
        tracker.update(ev)
        # the story counts new rows against what the microscope knows (the rows read too), so both say the same
        out.append({"tree": tree_figure(ev, token_text), "heat": heatmap_figure(tracker, ev, token_text),
                    "story": step_story(ev, token_text, values_known(known), ended=ended_by(trace, i)),
                    "emitted": len(ev.emitted),
                    "microscope": microscope_blocks(explain(trace, i, known))})
    telling = telling_step(trace)
    for i, step in enumerate(out):  # the tour's screens, for the first TOUR_STEPS steps and the telling one
        step["tour"] = tour_html(trace, i, token_text) if i < TOUR_STEPS or i == telling else ""
    return out


def step_runs(trace: Trace, token_text: TokenText) -> list[str]:
    """The text each step added: the recorded step texts, else the steps' token strings joined."""
    if len(trace.step_texts) == len(trace.steps):
        return list(trace.step_texts)
    return ["".join(token_text(t) for t in ev.emitted) for ev in trace.steps]


def answer_html(runs: list[str]) -> str:
    """The answer as escaped text, one span per step's run, alternating colours (as in the studio's chat)."""
    return "".join(f'<span class="run run-{"ab"[i % 2]}" data-step="{i}">{html.escape(text)}</span>'
                   for i, text in enumerate(runs))


def messages_html(trace: Trace) -> str:
    """The prompt conversation, escaped."""
    out = []
    for m in trace.messages:
        role, content = html.escape(m.get("role", "")), html.escape(m.get("content", ""))
        out.append(f'<div class="msg msg-{role}"><div class="role">{role}</div><div class="body">{content}</div></div>')
    return "".join(out)


def summary_line(trace: Trace) -> str:
    """One plain-text line: model, tree template, tokens, steps, mean accepted tokens, the measured speedup."""
    s = trace.summary
    n = s.new_tokens if s else sum(len(e.emitted) for e in trace.steps)
    steps = len(trace.steps)
    template = s.template if s and s.template else trace.settings.get("template", "?")
    copies = "matrix + context" if str(template).startswith("hybrid") else ""  # the studio's drafting switch's name
    parts = [trace.model or "unknown model", f"tree {template}" + (f" ({copies})" if copies else ""),
             f"{n} tokens in {steps} steps ({n / max(steps, 1):.2f} per step)"]
    speed = trace.speed or {}
    if speed.get("trusted") and speed.get("ratio") is not None:
        machine = machine_of(trace)
        parts.append(f"measured {speed['ratio']:.2f}× ± {speed.get('error') or 0.0:.2f} vs plain decoding"
                     + (f" on {machine}" if machine else " (machine not recorded)"))
    identical = True if trace.identical or speed.get("identical") else speed.get("identical")
    if words := identity_words(identical, speed.get("exact")):
        parts.append(words + (f" ({parting_text(speed['parted'])})" if speed.get("parted") and not identical else ""))
    return " · ".join(str(p) for p in parts)


def json_script(data: Any, elem_id: str) -> str:
    """Data as a JSON script block that no string in it can close or turn into markup."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # so '</' becomes '\u003c/'
    return f'<script type="application/json" id="{elem_id}">{text}</script>'


def plotly_js() -> str:
    """plotly.js itself, to inline (imported here only: `import tr_core` does not load plotly)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().replace("</script", "<\\/script")


def replay_html(trace: Trace, token_text: TokenText | None = None) -> str:
    """One answer as a self-contained HTML page (see the module docstring); `token_text` defaults to the trace's."""
    text_of = token_text or trace.token_text
    runs = step_runs(trace, text_of)
    data = {"steps": replay_steps(trace, text_of), "config": PLOTLY_CONFIG, "start": telling_step(trace)}
    n = len(trace.steps)
    title = html.escape(f"Token Recycling replay · {trace.model or 'unknown model'}")
    return PAGE.format(
        csp=CSP, title=title, css=CSS + MICROSCOPE_CSS + TOUR_CSS, summary=html.escape(summary_line(trace)), n=max(n, 1),
        messages=messages_html(trace), answer=answer_html(runs), plotly=plotly_js(), data=json_script(data, "tr-data"),
        script=SCRIPT + TOUR_JS)


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1>♻ Token Recycling replay</h1><p class="summary">{summary}</p></header>
<nav class="controls" aria-label="step">
<button id="tr-prev" type="button" title="previous step (←)">◀ Previous</button>
<input id="tr-step" type="range" min="1" max="{n}" value="1" step="1" aria-label="step">
<button id="tr-next" type="button" title="next step (→)">Next ▶</button>
<span id="tr-step-label">Step 1 of {n}</span>
<button id="tr-tour-btn" type="button" title="one idea a screen: → or space, Esc to close">▶ Guided tour of this step</button>
</nav>
<div id="tr-tour-box"></div>
<main>
<section class="text">
<div id="tr-story" class="story" aria-live="polite"></div>
<div id="tr-microscope" class="microscope"></div>
<h2>Answer <small>colours take turns, one per step; the shown step is outlined
(click a run to go there)</small></h2>
<div id="tr-answer" class="answer">{answer}</div>
<details><summary>Prompt</summary>{messages}</details>
</section>
<section class="figures">
<div id="tr-tree" class="fig"></div>
<div id="tr-heat" class="fig"></div>
</section>
</main>
<footer>In labels ␣ is a space, ↵ a new line, ⇥ a tab. Tree: the draft of the step, its accepted path (green) and
the bonus token the verifying forward added (amber star). Matrix window: rows of the adjacency matrix after the
step; ● marks the rows this step rewrote. Keys: ← → step, Home / End first / last. Recorded with Token Recycling
Studio; this file needs no network.</footer>
<script id="tr-plotly">{plotly}</script>
{data}
<script>{script}</script>
</body></html>
"""

CSS = """
body {font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1f2937;
      background: #f8fafc}
header {padding: 10px 20px 4px 20px}
h1 {font-size: 1.6rem; margin: 0}
h2 {font-size: 1.05rem; margin: 12px 0 6px 0}
h2 small {font-weight: normal; color: #64748b; font-size: 0.85rem}
.summary {color: #475569; margin: 4px 0}
.controls {position: sticky; top: 0; z-index: 5; display: flex; align-items: center; gap: 12px;
           padding: 8px 20px; background: #ffffffee; border-bottom: 1px solid #e2e8f0}
.controls input[type=range] {flex: 1; max-width: 640px; accent-color: #16a34a}
.controls button {font-size: 1rem; padding: 6px 14px; border-radius: 8px; border: 1px solid #cbd5e1;
                  background: white; cursor: pointer}
.controls button:disabled {opacity: 0.4; cursor: default}
#tr-step-label {font-weight: 700; font-size: 1.1rem; min-width: 9em}
main {display: grid; grid-template-columns: minmax(320px, 5fr) 7fr; gap: 16px; padding: 12px 20px}
@media (max-width: 1000px) {main {grid-template-columns: 1fr}}
.story {font-size: 1.15rem; line-height: 1.5; background: #eff6ff; border-left: 5px solid #1e3a8a;
        border-radius: 8px; padding: 10px 14px; min-height: 5.5em}
.answer {white-space: pre-wrap; overflow-wrap: anywhere; font-size: 1.05rem; line-height: 1.6; background: white; border: 1px solid #e2e8f0;
         border-radius: 10px; padding: 10px 12px; max-height: 46vh; overflow-y: auto}
.run {border-radius: 3px; cursor: pointer}
.run-a {background: #e5ded0}  /* not green: "accepted" in the tree */
.run-b {background: #bfdbfe}
.run.future {background: none; color: #94a3b8}
.run.current {outline: 3px solid #db2777; background: #fce7f3}
.fig {background: white; border: 1px solid #e2e8f0; border-radius: 10px; margin-bottom: 12px; min-height: 430px}
details {margin-top: 10px}
.msg {margin: 6px 0}
.msg .role {font-size: 0.8rem; color: #64748b; text-transform: uppercase}
.msg .body {white-space: pre-wrap; overflow-wrap: anywhere; background: white; border: 1px solid #e2e8f0; border-radius: 8px; padding: 6px 10px;
            max-height: 12em; overflow-y: auto}
footer {color: #64748b; font-size: 0.85rem; padding: 0 20px 16px 20px}
"""

SCRIPT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tr-data").textContent);
  var steps = data.steps, n = steps.length;
  var slider = document.getElementById("tr-step"), label = document.getElementById("tr-step-label");
  var prev = document.getElementById("tr-prev"), next = document.getElementById("tr-next");
  var story = document.getElementById("tr-story"), answer = document.getElementById("tr-answer");
  var microscope = document.getElementById("tr-microscope");
  var TAGS = ["div", "span", "details", "summary"];  // present.microscope.BLOCK_TAGS
  var runs = [];
  answer.querySelectorAll(".run").forEach(function (el) { runs[Number(el.dataset.step)] = el; });
  var current = 0;

  function reveal(el) {  // scroll the answer box (not the page) so that the run is visible
    if (!el) return;
    var top = el.offsetTop - answer.offsetTop, bottom = top + el.offsetHeight;
    if (top < answer.scrollTop || bottom > answer.scrollTop + answer.clientHeight) {
      answer.scrollTop = Math.max(0, top - answer.clientHeight / 3);
    }
  }

  function block(b) {  // one microscope block: an element of a known tag, its class, and text or children
    var el = document.createElement(TAGS.indexOf(b.t) >= 0 ? b.t : "div");
    el.className = typeof b.c === "string" ? b.c : "";
    if (typeof b.x === "string") el.textContent = b.x;
    else if (Array.isArray(b.k)) b.k.forEach(function (c) { el.appendChild(block(c)); });
    return el;
  }

  function show(i) {
    if (!n) {  // nothing to step through: say so, and no control pretends otherwise
      story.textContent = "This trace has no steps.";
      label.textContent = "No steps";
      prev.disabled = next.disabled = slider.disabled = true;
      return;
    }
    current = Math.max(0, Math.min(n - 1, i));
    var s = steps[current];
    slider.value = String(current + 1);
    label.textContent = "Step " + (current + 1) + " of " + n + " \\u00b7 " + s.emitted + " token"
      + (s.emitted === 1 ? "" : "s");
    story.textContent = s.story;
    microscope.replaceChildren(block(s.microscope));
    prev.disabled = current === 0;
    next.disabled = current === n - 1;
    runs.forEach(function (el, j) {
      el.classList.toggle("current", j === current);
      el.classList.toggle("future", j > current);
    });
    reveal(runs[current]);
    if (window.Plotly) {
      Plotly.react("tr-tree", s.tree.data, s.tree.layout, data.config);
      Plotly.react("tr-heat", s.heat.data, s.heat.layout, data.config);
    }
  }

  slider.addEventListener("input", function () { show(Number(slider.value) - 1); });
  prev.addEventListener("click", function () { show(current - 1); });
  next.addEventListener("click", function () { show(current + 1); });
  answer.addEventListener("click", function (e) {
    var el = e.target.closest ? e.target.closest(".run") : null;
    if (el) show(Number(el.dataset.step));
  });
  document.addEventListener("keydown", function (e) {
    if (e.target === slider || e.altKey || e.ctrlKey || e.metaKey) return;  // the slider moves itself
    var to = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: n - 1}[e.key];
    if (to !== undefined) { e.preventDefault(); show(to); }
  });
  var tourBtn = document.getElementById("tr-tour-btn"), tourBox = document.getElementById("tr-tour-box");
  tourBtn.addEventListener("click", function () {
    var markup = n ? steps[current].tour : "";
    if (!markup) { story.textContent = "This file holds no guided tour of this step (only of its first steps)."; return; }
    tourBox.innerHTML = markup;  // built and escaped by present.tour: no string of the trace is markup
    window.trTourOpen(tourBox);
  });
  tourBtn.disabled = !n;
  show(n ? Math.min(Math.max(Number(data.start) || 0, 0), n - 1) : 0);  // the telling step (present.tour)
})();
"""
