"""The page's browser-side scripts: no server time, no endpoint (downloads, the race, the presentation view, the
microscope toggle, the guided tour)."""
from __future__ import annotations

import json

from present.chat import CURRENT_RUN_CLASS
from present.tour import TOUR_JS

# Click the hidden download button once the replay file is set (it is disabled when there is no file).
DOWNLOAD_JS = """() => { const el = document.querySelector('#tr-export-html-file');
  const b = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
  if (b && !b.disabled) b.click(); }"""

# The race runs in the browser from the timeline in the race panel (present.race): no server time, no decoding.
# Each frame shows what present.race.race_frame gives at that time: the units (steps, tokens) ended by then.
RACE_JS = """() => {
  const box = document.querySelector('#tr-race-box .tr-race');
  if (!box) return;
  box.classList.add('tr-race-open');
  const close = box.querySelector('.tr-race-close');
  if (close) close.onclick = () => { box.classList.remove('tr-race-open'); window.trRaceRun = (window.trRaceRun || 0) + 1; };
  box.scrollIntoView({block: 'nearest'});
  const raw = box.getAttribute('data-timeline');
  if (!raw) return;
  const tl = JSON.parse(raw), text = Array.from(tl.text);
  const run = window.trRaceRun = (window.trRaceRun || 0) + 1;
  const ended = (times, t) => { let lo = 0, hi = times.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (times[mid] <= t) lo = mid + 1; else hi = mid; } return lo; };
  const t0 = performance.now();
  const frame = () => {
    if (window.trRaceRun !== run || !box.isConnected) return;
    const t = performance.now() - t0;
    for (const key of ['tr', 'plain']) {
      const side = tl[key], k = ended(side.times, t), pane = box.querySelector('#tr-race-' + key);
      const shown = k ? text.slice(0, side.chars[k - 1]).join('') : '';
      if (pane.textContent !== shown) { pane.textContent = shown; pane.scrollTop = pane.scrollHeight; }
      box.querySelector('#tr-race-' + key + '-count').textContent = side.labels[k];
      box.querySelector('.tr-lane-' + key).classList.toggle('tr-lane-done', k === side.times.length);
    }
    box.querySelector('#tr-race-clock').textContent = (Math.min(t, tl.total_ms) / 1000).toFixed(1) + ' s';
    if (t <= tl.total_ms) setTimeout(frame, 50);  // about 20 frames a second
  };
  frame();
}"""

# Presentation view: a class on the page root (assets/studio.css lays the page out for a 1280x720 projector).
PRESENT_LABELS = ("▣ Presentation view", "✕ Leave presentation view")
PRESENT_JS = """(on) => {
  const root = document.documentElement;
  on = typeof on === 'boolean' ? on : !root.classList.contains('tr-present');
  root.classList.toggle('tr-present', on);
  const url = new URL(window.location.href);
  if (on) url.searchParams.set('view', 'present'); else url.searchParams.delete('view');
  window.history.replaceState(null, '', url);
  // plotly writes the page's address into its paint references (url("<address>#id"), for the <base> gradio sets)
  // and keeps it for redraws: with the address changed they pointed at another document and the matrix's colour
  // bar drew empty. The plots take the new address, and what they drew is pointed at it.
  const base = window.location.href.split('#')[0];
  const here = (v) => v && v.replace(/url\\((["']?)[^#"')]*#/g, 'url($1' + base + '#');
  document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
    if (gd._context && gd._context._baseUrl) gd._context._baseUrl = base; });
  document.querySelectorAll('.js-plotly-plot [style*="url("], .js-plotly-plot [clip-path], .js-plotly-plot [fill^="url"]')
    .forEach((n) => { if (n.style.fill) n.style.fill = here(n.style.fill);
      for (const a of ['clip-path', 'fill']) if (n.hasAttribute(a)) n.setAttribute(a, here(n.getAttribute(a))); });
  const el = document.querySelector('#tr-present');
  const b = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
  if (b) b.textContent = on ? %s : %s;
  window.dispatchEvent(new Event('resize'));  // plotly refits the figures to their new widths
}""" % tuple(json.dumps(x) for x in reversed(PRESENT_LABELS))
# The microscope: in the presentation view an overlay over the tree (a class on the page root); else the details
# (the full step story and cost, and the microscope, scrolled to), shown or hidden again.
MICROSCOPE_JS = """() => {
  const root = document.documentElement, box = document.querySelector('#tr-microscope');
  if (root.classList.contains('tr-present')) { root.classList.toggle('tr-micro'); return; }
  if (root.classList.toggle('tr-detail') && box) box.scrollIntoView({block: 'nearest'});
}"""
PRESENT_FROM_URL_JS = ("() => { if (new URLSearchParams(window.location.search).get('view') === 'present') "
                       f"({PRESENT_JS})(true); }}")

# The presentation view's chat follows the step shown: the answer's last message scrolls (its row clips, nothing
# scrolls by hand) to put the outlined run of the step in the tree in sight, or its end while none is (readers saw
# the tree's step and its text never on one screen).
LINE_MARGIN = 4  # px shown above a line's top: the shown step's outline (2 px, 1 px off its text)
CHAT_FOLLOW_JS = """() => { if (window.trChatFollow) return; window.trChatFollow = true;
  const lines = (el, origin) => {  // each line of el's text as [top, bottom], in el's scrolled box, top to bottom
    const range = document.createRange(), found = [], walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const rects = [];  // the text's own boxes, a line's piece each (an element's box would span its lines)
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      range.selectNodeContents(node);
      rects.push(...range.getClientRects());
    }
    for (const r of rects) {
      if (r.height < 4) continue;
      const t = r.top - origin, line = found.find((l) => Math.abs(l[0] - t) < 6);
      if (line) { line[0] = Math.min(line[0], t); line[1] = Math.max(line[1], r.bottom - origin); }
      else found.push([t, r.bottom - origin]);
    }
    return found.sort((a, b) => a[0] - b[0]);
  };
  const follow = () => {
    if (!document.documentElement.classList.contains('tr-present')) return;
    const rows = document.querySelectorAll('#tr-chat .message-row.bot-row'), row = rows[rows.length - 1];
    if (!row) return;
    const run = row.querySelector('.%s'), box = row.getBoundingClientRect(), origin = box.top - row.scrollTop;
    const chatBox = document.querySelector('#tr-chat').getBoundingClientRect();
    const seen = Math.min(box.bottom, chatBox.bottom) - box.top;  // the chat clips the row's foot
    const found = lines(row, origin);
    if (!found.length) { row.scrollTop = 0; row.style.setProperty('--tr-cut', '0px'); return; }
    const end = found[found.length - 1][1] - seen;
    // the shown step's run in the middle, or the answer's end in view; snapped to a line's top, so that no line
    // shows cut in half at the top (the answer's room below lets it scroll there), and the lines that do not fit
    // whole at the bottom clipped off
    let to = Math.max(end, 0);
    if (run) { const r = run.getBoundingClientRect(); to = Math.min(to, r.top - origin - (seen - r.height) / 2); }
    const snap = (y) => found.find((l) => l[0] - %d >= y - 1);
    const last = snap(Math.max(end, 0)) || found[found.length - 1];
    const top = Math.max(0, Math.min((snap(to) || last)[0], last[0]) - %d);
    row.scrollTop = top;
    const cut = found.find((l) => l[1] > top + seen + 0.5);
    row.style.setProperty('--tr-cut', cut ? `${box.height - (cut[0] - top) + 2}px` : '0px');  // studio.css
  };
  const later = () => requestAnimationFrame(follow);
  const chat = document.querySelector('#tr-chat');
  if (chat) new MutationObserver(later).observe(chat, {subtree: true, childList: true, characterData: true,
                                                      attributes: true, attributeFilter: ['class']});
  // entering the presentation view lays the chat out anew, and the chat settles its own layout after it (a code
  // answer's line was left cut): follow at once, when the chat's box changes, and once more when that has settled
  const settle = () => { later(); setTimeout(later, 600); };
  new MutationObserver(settle).observe(document.documentElement, {attributes: true, attributeFilter: ['class']});
  if (chat && window.ResizeObserver) new ResizeObserver(later).observe(chat);
  window.addEventListener('resize', later); }""" % (CURRENT_RUN_CLASS, LINE_MARGIN, LINE_MARGIN)

# The side-by-side (studio/side_by_side.py) closes with its ✕ or Escape; a new comparison opens it again.
SIDES_INSTALL_JS = """() => { if (window.trSidesInstalled) return; window.trSidesInstalled = true;
  const close = () => document.querySelectorAll('.tr-sides.tr-sides-open').forEach((b) => b.classList.remove('tr-sides-open'));
  document.addEventListener('click', (e) => { if (!e.target.closest) return;
    if (e.target.closest('.tr-sides-close')) close();
    const tour = e.target.closest('.tr-side-tour');  // a card's guided tour (present/tour.py: its own overlay)
    if (tour && window.trTourOpen) window.trTourOpen(tour.closest('.tr-side').querySelector('.tr-tour')); });
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') close(); }); }"""

# The guided tour (present/tour.py): its script installs once with the page; a tour button opens the tour just drawn.
TOUR_INSTALL_JS = "() => {" + TOUR_JS + "}"
TOUR_OPEN_JS = "() => { if (window.trTourOpen) window.trTourOpen(document.querySelector('#tr-tour-box')); }"
