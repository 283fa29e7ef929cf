"""Real browser (Playwright + Debian's Chromium, headless): click an example, watch the answer, check the figures;
load a hostile shared trace (no outside fetch, no script, markup shown as text); a malformed trace is refused.

Saves a screenshot to $TR_SCREENSHOT if set (e.g. assets/screenshot.png), else to pytest's tmp dir;
$TR_SCREENSHOT_EXAMPLE names the example clicked (default: Translation, a short answer).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest_app import running_app
from tr_core.events import StepEvent, SummaryEvent
from tr_core.trace import Trace

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("TR_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

RATIO_RE = re.compile(r"(\d+\.\d\d)× ± (\d+\.\d\d)")
NOISY = "too noisy to measure"
# Tests wait on what the page says (the meter's data-state, the status, an element), never on a fixed pace: a busy
# machine only makes them slower. HUNG_MS bounds each wait so that a hung app fails instead of blocking forever; it is
# no estimate of how long an answer takes.
HUNG_MS = 1_800_000
METER_STATE_JS = ("(states) => { const m = document.querySelector('#tr-meter');"
                  " return !!(m && states.includes(m.dataset.state)); }")


IDLE_JS = "() => !document.querySelector('.gradio-container .wrap.generating, .gradio-container .wrap.pending')"


def wait_idle(page) -> None:
    """Wait until no event is running: Gradio's status trackers drop their 'generating' class once the event's
    generator has returned (the session is then free for the next request)."""
    page.wait_for_function(IDLE_JS, timeout=HUNG_MS)


def wait_meter_final(page, states: tuple[str, ...] = ("measured", "noisy")) -> None:
    """Wait until the meter's data-state is final: a trusted measurement, 'too noisy to measure' (or, with the
    measurement off, 'off')."""
    page.wait_for_function(METER_STATE_JS, arg=list(states), timeout=HUNG_MS)


def ratio_classes(ratio: float, error: float) -> set[str]:
    """The colour classes a displayed ratio ± error may have (either side of the 2-decimal rounding).

    up: clearly faster (ratio >= 1.05 and the error bar above 1); down: clearly slower; par otherwise.
    """
    out = set()
    for dr in (-0.005, 0.0, 0.005):
        for de in (-0.005, 0.0, 0.005):
            r, e = ratio + dr, max(error + de, 0.0)
            out.add("up" if r - e > 1.0 and r >= 1.05 else "down" if r + e < 1.0 and r <= 0.95 else "par")
    return out


def check_meter(page) -> None:
    """The final meter: a well-formed ratio whose colour agrees with its value, speeds, the identity flag."""
    label = page.locator("#tr-meter .tr-biglabel").inner_text().strip()
    ratio_el = page.locator("#tr-ratio")
    ratio = ratio_el.inner_text().strip()
    cls = ratio_el.get_attribute("class").split()
    meter = page.locator("#tr-meter").inner_text()
    assert float(page.locator("#tr-tps").inner_text()) > 0
    assert "differs from plain decoding" not in meter, meter
    if "(measured" in label:
        m = RATIO_RE.fullmatch(ratio)
        assert m, ratio
        r, e = float(m.group(1)), float(m.group(2))
        shown = [c.removeprefix("tr-ratio-") for c in cls if c.startswith("tr-ratio-")]
        assert len(shown) == 1 and shown[0] in ratio_classes(r, e), (ratio, cls)
        if r < 0.95:
            assert "tr-ratio-up" not in cls, (ratio, cls)
        if r > 1.05:
            assert "tr-ratio-down" not in cls, (ratio, cls)
        assert {"up": "(measured)", "down": "slower", "par": "no clear difference"}[shown[0]] in label, (label, cls)
        assert label.startswith("as fast as plain decoding"), label
        assert float(page.locator("#tr-plain").inner_text()) > 0
        assert "token-identical" in meter, meter
    else:
        assert ratio == NOISY, (label, ratio)
        assert "tr-ratio-up" not in cls and "tr-ratio-down" not in cls, cls
        assert "token-identical" in meter or "not compared" in meter, meter


def test_example_click_streams_answer_and_draws_tree_heatmap_and_meter(tmp_path):
    shot = Path(os.environ.get("TR_SCREENSHOT") or tmp_path / "screenshot.png")
    with running_app() as url, playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
            page.goto(url, wait_until="load", timeout=HUNG_MS)
            page.wait_for_selector("#tr-examples", timeout=HUNG_MS)
            # a short answer keeps the test short on a CPU; the example button itself is what a visitor clicks
            # ($TR_SCREENSHOT_EXAMPLE picks another example for the README's picture)
            example = os.environ.get("TR_SCREENSHOT_EXAMPLE", "Translation")
            page.locator("#tr-examples").get_by_text(example, exact=True).click()
            # streaming: the answer and the live tree appear before the run ends
            page.wait_for_selector("#tr-chat .message.bot span.tr-run-a, #tr-chat [data-testid='bot'] span.tr-run-a",
                                   timeout=HUNG_MS)
            wait_meter_final(page)
            check_meter(page)
            # plotly drew SVG: tree markers (one per node; the default tree's size depends on the device) and heatmap
            page.wait_for_function("() => document.querySelectorAll('#tr-tree .scatterlayer .point').length >= 1",
                                   timeout=HUNG_MS)  # one point: a step that drafted nothing (said in its title)
            title = page.locator("#tr-tree .gtitle").text_content()
            assert "accepted" in title or "drafted nothing" in title, title
            assert re.search(r"Greedy decoding", page.locator("#tr-decoding").inner_text())  # beside the answer
            assert page.locator("#tr-tree svg.main-svg").count() >= 1
            assert page.locator("#tr-heat svg.main-svg").count() >= 1
            assert page.locator("#tr-heat .hm, #tr-heat image, #tr-heat .heatmaplayer").count() >= 1
            assert page.locator("#tr-chart .bars .point").count() >= 1
            assert "drafted" in page.locator("#tr-story").inner_text()  # the story of the step shown
            # the microscope's root chip: white on navy (the page's prose colour once made it navy on navy)
            chip = page.locator("#tr-microscope .trm-root").first
            assert chip.evaluate("el => getComputedStyle(el).color") == "rgb(255, 255, 255)"
            answer = page.locator("#tr-chat").inner_text()
            assert len(answer.strip()) > 20
            page.mouse.move(5, 5)  # no hover label in the picture
            page.locator("#tr-chat .message-row.user-row").last.scroll_into_view_if_needed()  # the question in sight
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000


# ------------------------------------------------------------------------------ shared app for the trace tests

LEAK_HOST = "127.0.0.1:9"
PAYLOAD = (f'<img src="http://{LEAK_HOST}/leak1.png"> ![x](http://{LEAK_HOST}/leak2.png) '
           f'<span style="background-image:url(http://{LEAK_HOST}/leak3.png)">x</span> '
           '<script>window.__pwned=1</script>')
TIMINGS = {"draft": 0.1, "forward": 10.0, "verify": 0.2, "commit": 0.1, "update": 0.3, "total": 10.7}


def _step(step: int, stopped: bool = False) -> StepEvent:
    """A 7-node tree: root -> {1, 4}; 1 -> {2, 5}; 2 -> {3}; 4 -> {7}. Accepted root-1-2, bonus 8 (or cut by a stop)."""
    return StepEvent(
        step=step, position=10 + 3 * step, tokens=[0, 1, 4, 2, 5, 7, 3], parents=[-1, 0, 0, 1, 1, 2, 3],
        depths=[0, 1, 1, 2, 2, 2, 3], ranks=[-1, 0, 1, 0, 1, 0, 0], accepted=[0, 1, 3],
        emitted=[1] if stopped else [1, 2, 8], bonus=None if stopped else 8, timings=dict(TIMINGS),
        matrix_rows=[0, 1, 2, 4], matrix_values=[[1, 4], [2, 5], [8, 3], [7, 9]],
        matrix_probs=[[0.7, 0.2], [0.6, 0.3], [0.9, 0.05], [0.5, 0.4]], template="tiny")


def hostile_trace() -> Trace:
    """A valid 3-step trace whose model name, messages, step texts and token strings all carry HTML/markdown images."""
    trace = Trace(model=f"tiny {PAYLOAD}", settings={"template": "tiny", "temperature": 0.0, "k": 2},
                  messages=[{"role": "system", "content": f"Be brief. {PAYLOAD}"},
                            {"role": "user", "content": f"hi {PAYLOAD}"}])
    vocab = {t: f" w{t} {PAYLOAD}" if t % 2 else f"<img src=\"http://{LEAK_HOST}/leak{t}.png\">" for t in range(10)}
    for ev in (_step(0), _step(1), _step(2, stopped=True)):
        trace.add_step(ev, vocab.__getitem__)
    # step 2 also opens a code block (shown as coloured HTML, not markdown) that step 3 carries on: markup stays text
    trace.step_texts = [f" the {PAYLOAD}\n", f"![x](http://{LEAK_HOST}/leak2.png) cat\n```html\n{PAYLOAD}",
                        f"\n<img src=http://{LEAK_HOST}/leak9.png>\n```\n the"]
    tokens = [1, 2, 8, 1, 2, 8, 1]
    trace.summary = SummaryEvent(tokens=tokens, prompt_tokens=5, new_tokens=len(tokens), steps=3, mean_accepted=7 / 3,
                                 tokens_per_s=100.0, prefill_s=0.1, decode_s=0.06, wall_s=0.16, stop_reason="eos",
                                 method="recycling", template="tiny", matrix_rows_filled=5, matrix_mb=0.1)
    return trace


@pytest.fixture(scope="module")
def app_browser():
    """One app and one Chromium for the trace tests; each test opens its own page (its own session)."""
    with running_app() as url, playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield url, browser
        finally:
            browser.close()


def open_page(browser, url: str):
    """A fresh page on the app that records every request and aborts (and records) any request leaving the app."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    seen: list[str] = []
    outside: list[str] = []
    page.on("request", lambda req: seen.append(req.url))

    def guard(route):
        if route.request.url.startswith(url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", guard)
    page.goto(url, wait_until="load", timeout=HUNG_MS)
    page.wait_for_selector("#tr-examples", timeout=HUNG_MS)
    page.wait_for_selector("#tr-trace-upload", timeout=HUNG_MS)
    return context, page, seen, outside


def upload_trace(page, path: Path) -> None:
    """Upload a file through the 'Load a trace' UploadButton, as a visitor would (the file chooser of its button)."""
    inputs = page.locator("#tr-trace-upload input[type=file]")
    if inputs.count() == 0:  # the hidden input may sit next to the button rather than inside it
        inputs = page.locator("#tr-trace-upload").locator("xpath=..").locator("input[type=file]")
    if inputs.count() == 1:
        inputs.set_input_files(str(path))
    else:
        with page.expect_file_chooser(timeout=HUNG_MS) as chooser:
            page.locator("#tr-trace-upload").click()
        chooser.value.set_files(str(path))


def status_text(page) -> str:
    return page.locator("#tr-status").inner_text()


def wait_status(page, text: str, timeout: float = HUNG_MS) -> None:
    page.wait_for_function("(t) => { const s = document.querySelector('#tr-status');"
                           " return !!(s && s.innerText.includes(t)); }", arg=text, timeout=timeout)


def no_error_toast(page) -> None:
    errors = page.locator(".toast-body.error, .toast-wrap .error")
    assert errors.count() == 0, errors.all_inner_texts()


def leaks(seen: list[str], outside: list[str]) -> list[str]:
    return [u for u in seen + outside if LEAK_HOST in u or "leak" in u]


def hover_figures(page) -> str:
    """Move the mouse over the tree's nodes and the heatmap's cells so plotly draws hover labels; return their text."""
    shown = []

    def labels() -> None:
        page.wait_for_timeout(200)
        shown.append(page.evaluate("() => [...document.querySelectorAll('.hoverlayer')].map(e => e.textContent).join(' ')"))

    points = page.locator("#tr-tree .scatterlayer .point")
    for i in range(min(points.count(), 6)):
        box = points.nth(i).bounding_box()
        if box:
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            labels()
    heat = page.locator("#tr-heat .nsewdrag").first
    box = heat.bounding_box() if heat.count() else None
    if box:
        for fx, fy in ((0.2, 0.2), (0.5, 0.5), (0.8, 0.8)):
            page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
            labels()
    page.mouse.move(5, 5)
    return " ".join(shown)


DOM_LEAK_JS = """() => {
  const bad = [];
  for (const el of document.querySelectorAll('img, image, source, video, audio, iframe, object, embed, link')) {
    const src = el.getAttribute('src') || el.getAttribute('href') || el.getAttribute('xlink:href') || '';
    if (src.includes('leak') || src.includes('127.0.0.1:9/')) bad.push(el.outerHTML.slice(0, 200));
  }
  for (const el of document.querySelectorAll('[style]')) {
    if (el.getAttribute('style').includes('leak')) bad.push(el.outerHTML.slice(0, 200));
  }
  for (const el of document.querySelectorAll('script')) {
    if ((el.textContent || '').includes('__pwned')) bad.push(el.outerHTML.slice(0, 200));
  }
  return bad;
}"""


def test_hostile_shared_trace_fetches_nothing_and_shows_markup_as_text(app_browser, tmp_path):
    url, browser = app_browser
    path = hostile_trace().save(tmp_path / "hostile.json")
    assert Trace.load(path).to_dict() == hostile_trace().to_dict()  # valid: the studio must accept it
    context, page, seen, outside = open_page(browser, url)
    try:
        outside_at_load = list(outside)  # not the trace's doing (fonts, say), but the page must fetch nothing either
        upload_trace(page, path)
        wait_status(page, "Loaded a trace")
        page.wait_for_function("() => document.querySelectorAll('#tr-tree .scatterlayer .point').length >= 2",
                               timeout=HUNG_MS)
        page.wait_for_timeout(1000)  # give any image a chance to be requested
        chat = page.locator("#tr-chat")
        chat_text = chat.inner_text()
        assert "<img" in chat_text and "<script>" in chat_text, chat_text  # escaped markup, visible as text
        assert "![x](" in chat_text or "![x]" in chat_text, chat_text  # the markdown image stays text too
        assert chat.locator("img[src*='leak']").count() == 0
        code = chat.locator("pre.tr-code").first.inner_text()  # the code block, its runs coloured, markup as text
        assert "<img src=http" in code and "<script>" in code and chat.locator("pre.tr-code span.tr-run-b").count() > 0
        assert "<img" in status_text(page)  # the model name, as text
        assert page.evaluate("() => typeof window.__pwned") == "undefined"
        assert page.evaluate(DOM_LEAK_JS) == []
        hovered = hover_figures(page)
        assert "<img" in hovered or "leak" in hovered, hovered  # hover labels show the token strings as text
        # replay: previous, then next step; each redraws the chat, the tree and the heatmap from the trace
        page.get_by_role("button", name="◀ Previous step").click()
        wait_status(page, "Replaying step 1 of 3")
        assert "Step 1 drafted 6 tokens" in page.locator("#tr-story").inner_text()  # the story follows the replay
        hover_figures(page)
        page.get_by_role("button", name="Next step ▶").click()
        wait_status(page, "Replaying step 2 of 3")
        page.get_by_role("button", name="Next step ▶").click()
        wait_status(page, "Replaying step 3 of 3")
        story = page.locator("#tr-story").inner_text()
        assert story.startswith("This step: Step 3 drafted") and "<img" in story, story  # token text, as text
        hover_figures(page)
        with page.expect_download(timeout=HUNG_MS) as download:  # the offline HTML replay of this answer
            page.locator("#tr-export-html").click()
        saved = tmp_path / "replay.html"
        download.value.save_as(saved)
        wait_status(page, "Replay of 3 steps")
        exported = saved.read_text(encoding="utf-8")
        assert "Step 3 drafted" in exported and "&lt;script&gt;window.__pwned=1" in exported
        page.wait_for_timeout(1000)
        assert "<img" in page.locator("#tr-chat").inner_text()
        assert page.evaluate("() => typeof window.__pwned") == "undefined"
        assert page.evaluate(DOM_LEAK_JS) == []
        no_error_toast(page)
        assert leaks(seen, outside) == [], leaks(seen, outside)
        assert outside == [], f"requests outside the app (at page load: {outside_at_load}): {outside}"
    finally:
        context.close()


def test_malformed_trace_is_refused_and_the_session_goes_on(app_browser, tmp_path):
    url, browser = app_browser
    bad = hostile_trace().to_dict()
    bad["model"], bad["messages"] = "tiny", [{"role": "user", "content": "hi"}]
    bad["steps"][1]["parents"][3] = 99  # out of range: node 3's parent must be 0..2
    path = tmp_path / "bad_trace.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    context, page, seen, outside = open_page(browser, url)
    try:
        # no speed measurement: this test is about uploads, and the answer alone is quicker on a small CPU
        page.get_by_text("Decoding settings", exact=True).click()
        compare = page.get_by_label("Measure the speedup against plain decoding after each answer")
        compare.uncheck()
        assert not compare.is_checked()
        box = page.locator("#tr-msg textarea, textarea#tr-msg, #tr-msg input").first
        box.fill("Say hi.")
        box.press("Enter")
        wait_meter_final(page, ("off",))  # the answer is over: the meter left its live state, unmeasured
        assert page.locator("#tr-chat span.tr-run-a").count() >= 1
        wait_idle(page)  # and its request has returned: the session takes the upload
        before = page.locator("#tr-chat").inner_text()
        assert "Say hi." in before and len(before.strip()) > len("Say hi.") + 2, before
        meter_before = page.locator("#tr-meter").inner_text()

        upload_trace(page, path)
        wait_status(page, "✗")
        status = status_text(page)
        assert "cannot be loaded" in status and "parent of node 3" in status, status
        assert str(tmp_path) not in status and "bad_trace" not in status, status  # no server path echoed
        page.wait_for_timeout(500)
        assert page.locator("#tr-chat").inner_text() == before
        assert page.locator("#tr-meter").inner_text() == meter_before

        # the session still works: replay the answer it kept
        page.get_by_role("button", name="Next step ▶").click()
        wait_status(page, "Replaying step")
        assert re.search(r"Replaying step \d+ of \d+", status_text(page)), status_text(page)
        after = page.locator("#tr-chat").inner_text()
        assert "Say hi." in after and len(after.strip()) > len("Say hi.") + 2, after
        page.get_by_role("button", name="◀ Previous step").click()
        wait_idle(page)
        wait_status(page, "Replaying step")
        no_error_toast(page)
        assert [u for u in outside if LEAK_HOST in u] == []
    finally:
        context.close()


# ------------------------------------------------------------------------ presentation view and the race

PROJECTOR = {"width": 1280, "height": 720}
RECT_JS = ("(s) => { const r = document.querySelector(s).getBoundingClientRect();"
           " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width}; }")
FONT_JS = "(s) => parseFloat(getComputedStyle(document.querySelector(s)).fontSize)"
SETTLED_JS = ("([sels, w, h]) => sels.every(s => { const r = document.querySelector(s).getBoundingClientRect();"
              " return r.width > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= h && r.right <= w; })")
PRESENTING_JS = "() => document.documentElement.classList.contains('tr-present')"
NOT_PRESENTING_JS = "() => !document.documentElement.classList.contains('tr-present')"


PANELS = ("#tr-meter-box", "#tr-tree", "#tr-heat", "#tr-story", "#tr-cost", "#tr-nav-buttons", "#tr-decoding",
          "#tr-input-row", "#tr-status")  # what a lecture hall must see at once
TEXT_PANELS = ("#tr-meter-box", "#tr-story", "#tr-cost", "#tr-decoding", "#tr-nav-buttons",
               "#tr-status")  # nothing may be cut off
# Every visible piece of text in the panels (HTML text and plotly's SVG text), its computed font size in px.
FONT_SIZES_JS = """(sels) => {
  const out = [];
  for (const sel of sels) for (const el of document.querySelectorAll(sel + ' *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const r = el.getBoundingClientRect();
    if (!own || r.width === 0 || r.height === 0 || getComputedStyle(el).visibility === 'hidden') continue;
    if (el.closest('.hoverlayer, .modebar, .sr-only, .hide')) continue;  // hover labels and tools: not on show
    out.push([sel, el.tagName, el.textContent.trim().slice(0, 30), parseFloat(getComputedStyle(el).fontSize)]);
  }
  return out; }"""
BUTTONS_JS = ("(s) => [...document.querySelectorAll(s + ' button')].filter(b => b.getBoundingClientRect().width > 0)"
              ".map(b => { const r = b.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, right: r.right,"
              " text: b.innerText}; })")
MARKS_JS = ("(s) => [...document.querySelectorAll(s)].map(e => e.getBoundingClientRect()).filter(r => r.width > 0)"
            ".map(r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right}))")
CUT_JS = ("(s) => { const el = document.querySelector(s);"
          " return [el.scrollHeight - el.clientHeight, el.scrollWidth - el.clientWidth]; }")


# The presentation view's question: whole (no fading mask over it or its boxes), the answer's box under it (no line
# of the answer slides beneath it) and clipping its own overflow, the answer's last run inside the chat.
QUESTION_WHOLE_JS = """() => {
  const q = document.querySelector('#tr-chat .message-row.user-row'), a = document.querySelector('#tr-chat .bot-row');
  const masked = [];
  for (let el = q; el && el.id !== 'tr-chat'; el = el.parentElement) {
    const m = getComputedStyle(el).maskImage || getComputedStyle(el).webkitMaskImage;
    if (m && m !== 'none') masked.push(el.className);
  }
  const runs = a.querySelectorAll('.tr-run-a, .tr-run-b');
  return {masked, questionBottom: q.getBoundingClientRect().bottom, answerTop: a.getBoundingClientRect().top,
          answerOverflow: getComputedStyle(a).overflowY,
          lastRun: runs.length ? runs[runs.length - 1].getBoundingClientRect().bottom : 0}; }"""
# The outlined run of the step the tree shows, in the presentation view's chat: its box, and the chat's text box.
CURRENT_RUN_JS = """() => { const run = document.querySelector('#tr-chat .tr-run-current');
  const rows = document.querySelectorAll('#tr-chat .message-row.bot-row'), row = rows[rows.length - 1];
  const r = run && run.getBoundingClientRect(), b = row.getBoundingClientRect();
  return r && {top: r.top, bottom: r.bottom, rowTop: b.top, rowBottom: b.bottom}; }"""


# The answer's lines that its box's top edge, or its clip's bottom edge, cuts through (the presentation view's
# chat), how many lines show whole, and where the clip ends.
CUT_LINES_JS = """() => { const rows = document.querySelectorAll('#tr-chat .message-row.bot-row');
  const row = rows[rows.length - 1], top = row.getBoundingClientRect().top, range = document.createRange();
  const walk = document.createTreeWalker(row, NodeFilter.SHOW_TEXT), rects = [];
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    range.selectNodeContents(node);
    rects.push(...range.getClientRects());
  }
  const cut = parseFloat(getComputedStyle(row).getPropertyValue('--tr-cut')) || 0;
  const bottom = Math.min(row.getBoundingClientRect().bottom - cut,  // what the clip and the chat leave
    document.querySelector('#tr-chat').getBoundingClientRect().bottom);
  const text = rects.filter((r) => r.height >= 4);
  return {cut: text.filter((r) => (r.top < top - 1 && r.bottom > top + 1) || (r.top < bottom - 1 && r.bottom > bottom + 1))
    .map((r) => [r.top, r.bottom, top, bottom]), shown: text.filter((r) => r.top >= top - 1 && r.bottom <= bottom + 1).length,
    bottom}; }"""


def check_step_in_chat(page) -> None:
    """The presentation view's chat shows the run of the step in the tree (readers saw the tree's step and its
    text never on one screen): the outlined run lies inside the answer's box, and no line shows cut in half at
    the box's top or bottom (readers read half a line as hidden by the question)."""
    page.wait_for_timeout(300)  # the chat scrolls on the next frame after the update
    run = page.evaluate(CURRENT_RUN_JS)
    assert run and run["top"] >= run["rowTop"] - 0.5 and run["bottom"] <= run["rowBottom"] + 0.5, run
    lines = page.evaluate(CUT_LINES_JS)
    assert lines["cut"] == [] and lines["shown"] > 0 and run["bottom"] <= lines["bottom"] + 0.5, (lines, run)


# The paint references (url(...#id)) in the plots that point at another address than this page's: plotly writes the
# page's address into them, and the presentation view changes it (a cold reader saw the colour bar drawn empty).
FOREIGN_PAINT_JS = """() => { const here = window.location.href.split('#')[0];
  return [...document.querySelectorAll('.js-plotly-plot *')].flatMap((n) =>
    [n.style.fill, n.getAttribute('fill'), n.getAttribute('clip-path')]).filter((v) => v && v.includes('url('))
    .filter((v) => { const m = v.match(/url\\(["']?([^#"')]*)#/); return m && m[1] !== '' && m[1] !== here; }); }"""


def check_projector_screen(page) -> None:
    """Every panel lies inside the 1280x720 screen by its computed geometry, no two overlap, text panels hold all
    their text, and no text in them is under 16 px. It first waits for the layout to settle: a redrawn plot is
    sized by plotly after the update that brought it (a moment later on a busy machine); if it never fits, the
    asserts below say which panel does not."""
    try:
        page.wait_for_function(SETTLED_JS, arg=[list(PANELS), PROJECTOR["width"], PROJECTOR["height"]],
                               timeout=30_000)
    except Exception:  # noqa: BLE001 - the geometry asserts report the panel
        pass
    rects = {sel: page.evaluate(RECT_JS, sel) for sel in PANELS}
    assert page.evaluate(FOREIGN_PAINT_JS) == [], page.evaluate(FOREIGN_PAINT_JS)  # the colour bar drawn, not empty
    for sel, r in rects.items():
        assert r["width"] > 0 and r["top"] >= 0 and r["left"] >= 0, (sel, r)
        assert r["bottom"] <= PROJECTOR["height"] and r["right"] <= PROJECTOR["width"], (sel, r)
    names = list(rects)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ra, rb = rects[a], rects[b]
            w = min(ra["right"], rb["right"]) - max(ra["left"], rb["left"])
            h = min(ra["bottom"], rb["bottom"]) - max(ra["top"], rb["top"])
            assert w <= 0.5 or h <= 0.5, (a, ra, b, rb)
    for sel in TEXT_PANELS:
        assert page.evaluate(CUT_JS, sel) <= [1, 1], (sel, page.evaluate(CUT_JS, sel))
    small = [f for f in page.evaluate(FONT_SIZES_JS, list(PANELS)) if f[3] < 16]
    assert not small, small
    assert rects["#tr-tree"]["width"] >= 640  # the tree's labels are placed for 640 px or more
    form = page.evaluate(RECT_JS, "div.form:has(> #tr-drafting)")  # the drafting choices on one line, all in sight
    for r in page.evaluate(BUTTONS_JS.replace(" button'", " label'"), "#tr-drafting"):
        assert r["top"] >= form["top"] - 0.5 and r["bottom"] <= form["bottom"] + 0.5, (r, form)
        assert r["right"] <= form["right"] + 0.5, (r, form)
    for row in ("#tr-input-row", "#tr-nav-buttons"):  # every button on its row's one line, none wrapped out of it
        outer = rects[row]
        for r in page.evaluate(BUTTONS_JS, row):
            assert r["top"] >= outer["top"] - 0.5 and r["bottom"] <= outer["bottom"] + 0.5, (row, r, outer)
            assert r["right"] <= outer["right"] + 0.5, (row, r, outer)
    chat = page.evaluate(RECT_JS, "#tr-chat")
    assert chat["bottom"] - chat["top"] >= 90, chat  # the answer's last lines, not one: 16-18 px text
    check_corner_buttons(page, rects)


def overlap(a: dict, b: dict) -> bool:
    """Two rectangles share more than half a pixel each way."""
    w = min(a["right"], b["right"]) - max(a["left"], b["left"])
    h = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return w > 0.5 and h > 0.5


def check_corner_buttons(page, rects: dict) -> None:
    """The two buttons that are not about the step (leave, the paper vs the hybrid): in the screen, in the status
    line's corner, over no other panel (readers saw them over the tree), no status text and not each other."""
    buttons = [page.evaluate(RECT_JS, sel) for sel in ("#tr-compare-methods", "#tr-present")]
    assert not overlap(*buttons), buttons
    text = page.evaluate(MARKS_JS, "#tr-status p, #tr-status li")
    for b in buttons:
        assert b["width"] > 0 and b["top"] >= 0 and b["bottom"] <= PROJECTOR["height"], b
        assert b["right"] <= PROJECTOR["width"], b
        assert [s for s, r in rects.items() if s != "#tr-status" and overlap(r, b)] == [], (b, rects)
        assert [r for r in text if overlap(r, b)] == [], (b, text)


def test_presentation_view_carries_a_lecture_on_one_projector_screen(app_browser, tmp_path):
    """?view=present at 1280x720: settings hidden; after an answer the meter, the tree, the matrix window, the story,
    the cost and the step controls are all inside the screen, none over another, nothing cut off, no text under
    16 px; previous/next replay steps in place; the microscope opens over the tree. Saves $TR_PRESENT_SCREENSHOT."""
    url, browser = app_browser
    shot = Path(os.environ.get("TR_PRESENT_SCREENSHOT") or tmp_path / "presentation.png")
    context = browser.new_context(viewport=PROJECTOR, device_scale_factor=1)
    page = context.new_page()
    try:
        page.goto(url + "?view=present", wait_until="load", timeout=HUNG_MS)
        page.wait_for_selector("#tr-present", timeout=HUNG_MS)
        page.wait_for_function(PRESENTING_JS, timeout=HUNG_MS)
        assert not page.locator("#tr-settings").is_visible() and not page.locator("#tr-examples").is_visible()
        big_story = page.evaluate(FONT_JS, "#tr-story .tr-story")
        page.locator("#tr-present").click()  # leave: the settings come back, the address loses ?view=present
        page.wait_for_function(NOT_PRESENTING_JS, timeout=HUNG_MS)
        assert page.locator("#tr-settings").is_visible() and "view=present" not in page.url
        assert page.evaluate(FONT_JS, "#tr-story .tr-story") < big_story  # presenting enlarges the story
        page.locator("#tr-present").click()
        page.wait_for_function(PRESENTING_JS, timeout=HUNG_MS)
        assert "view=present" in page.url
        box = page.locator("#tr-msg textarea, textarea#tr-msg, #tr-msg input").first
        box.fill("Translate to French: The weather is nice today, so we are going to the beach.")
        box.press("Enter")
        wait_meter_final(page)
        check_meter(page)
        wait_idle(page)
        page.wait_for_function("() => document.querySelectorAll('#tr-tree .scatterlayer .point').length >= 1",
                               timeout=HUNG_MS)
        assert page.evaluate("() => window.scrollY") == 0
        check_projector_screen(page)
        story = page.locator("#tr-story").inner_text()
        assert story.startswith("This step:") and ("drafted" in story or "Plain step" in story), story
        question = page.evaluate(RECT_JS, "#tr-chat .message-row.user-row")  # the question stays in sight
        chat = page.evaluate(RECT_JS, "#tr-chat")
        assert chat["top"] <= question["top"] and question["bottom"] <= chat["bottom"], (question, chat)
        assert "Translate to French" in page.locator("#tr-chat .message-row.user-row").last.inner_text()
        whole = page.evaluate(QUESTION_WHOLE_JS)  # a cold reader saw its bubble cut, and answer lines under it
        assert whole["masked"] == [] and whole["answerTop"] >= whole["questionBottom"] - 0.5, whole
        assert whole["answerOverflow"] == "hidden", whole
        check_step_in_chat(page)
        small = [f for f in page.evaluate(FONT_SIZES_JS, ["#tr-chat", "#tr-head"]) if f[3] < 16]
        assert not small, small  # the chat and the leave button read from the back row too
        page.mouse.move(640, 715)  # no hover label or plotly toolbar in the picture
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))  # the projector's screen, as the room sees it
        page.locator("#tr-prev").click()  # the step controls replay in place
        wait_status(page, "Replaying step")
        wait_idle(page)
        check_projector_screen(page)
        check_step_in_chat(page)
        page.locator("#tr-micro-btn").click()  # the microscope opens over the tree, inside the screen
        page.wait_for_function("() => document.documentElement.classList.contains('tr-micro')", timeout=HUNG_MS)
        r = page.evaluate(RECT_JS, "#tr-microscope")
        assert r["width"] > 300 and r["top"] >= 0 and r["bottom"] <= PROJECTOR["height"], r
        assert r["right"] <= PROJECTOR["width"], r
        no_error_toast(page)
    finally:
        context.close()
    assert shot.stat().st_size > 10_000


SIDES_OPEN_JS = "() => !!document.querySelector('#tr-sides .tr-sides-open')"
SIDES_CLOSED_JS = "() => !document.querySelector('#tr-sides .tr-sides-open')"
# The smallest text of each picture under `s` as drawn: its font size times the picture's scale on the screen.
SVG_TEXT_PX_JS = """(s) => [...document.querySelectorAll(s + ' svg')].filter(g => g.querySelector('text')
  && g.getBoundingClientRect().width > 0).map(g => {  // drawn ones (a card's tour is closed)
  const r = g.getBoundingClientRect(), box = g.viewBox.baseVal;  // drawn to fit both sides (letterboxed)
  const scale = Math.min(r.width / box.width, r.height / box.height);
  return Math.min(...[...g.querySelectorAll('text')].map(t => parseFloat(t.getAttribute('font-size')) * scale)); })"""


def test_the_papers_method_beside_the_hybrid_full_width_then_over_the_projector_screen(app_browser, tmp_path):
    """Issue 55: one button answers the last question with the paper's 80-node tree and with the hybrid; the panel
    spans the page under the answer (two trees and the bars of why), then, presenting at 1280x720, it opens over
    the whole screen with nothing cut off and no text under 16 px; its ✕ gives the screen back. Saves
    $TR_SIDES_SCREENSHOT (the page's panel) and $TR_SIDES_PRESENT_SCREENSHOT (the projector's screen)."""
    url, browser = app_browser
    shots = {key: Path(os.environ.get(f"TR_SIDES{key}_SCREENSHOT") or tmp_path / f"sides{key}.png")
             for key in ("", "_PRESENT")}
    context = browser.new_context(viewport=PROJECTOR, device_scale_factor=1)
    page = context.new_page()
    try:
        page.goto(url, wait_until="load", timeout=HUNG_MS)
        box = page.locator("#tr-msg textarea, textarea#tr-msg, #tr-msg input").first
        box.fill(os.environ.get("TR_SIDES_QUESTION", "Name three prime numbers and say why each is prime."))
        box.press("Enter")
        wait_meter_final(page, ("measured", "noisy", "off"))
        wait_idle(page)
        page.locator("#tr-compare-methods").click()
        page.wait_for_function(SIDES_OPEN_JS, timeout=HUNG_MS)
        wait_idle(page)
        panel = page.evaluate(RECT_JS, "#tr-sides .tr-sides")
        top = page.evaluate(RECT_JS, "#tr-top")
        assert panel["width"] >= 0.95 * top["width"] and panel["top"] >= top["bottom"] - 1, (panel, top)
        shown = page.locator("#tr-sides").inner_text()
        assert "All 3 answers are plain decoding's, token for token" in shown, shown
        pictures = page.locator("#tr-sides .tr-side-pic svg, #tr-sides .tr-sides-why svg")
        assert pictures.count() == 4 and "×" in shown  # three trees and the bars
        page.locator("#tr-sides").screenshot(path=str(shots[""]))
        check_card_tour(page)
        page.locator("#tr-present").click()
        page.wait_for_function(PRESENTING_JS, timeout=HUNG_MS)
        page.wait_for_function(SIDES_OPEN_JS, timeout=HUNG_MS)
        over = page.evaluate(RECT_JS, "#tr-sides .tr-sides")
        assert over["top"] >= 0 and over["left"] >= 0 and over["bottom"] <= PROJECTOR["height"], over
        assert over["right"] <= PROJECTOR["width"] and over["width"] >= 0.9 * PROJECTOR["width"], over
        assert page.evaluate(CUT_JS, "#tr-sides .tr-sides") <= [1, 1], page.evaluate(CUT_JS, "#tr-sides .tr-sides")
        small = [f for f in page.evaluate(FONT_SIZES_JS, ["#tr-sides"]) if f[3] < 16]
        assert not small, small
        drawn = page.evaluate(SVG_TEXT_PX_JS, "#tr-sides")
        assert drawn and min(drawn) >= 16, drawn  # the bars' words, as the room sees them
        page.mouse.move(640, 715)
        page.screenshot(path=str(shots["_PRESENT"]))
        page.locator("#tr-sides .tr-sides-close").click()
        page.wait_for_function(SIDES_CLOSED_JS, timeout=HUNG_MS)
        check_projector_screen(page)  # the comparison's button has its own place on the screen
        check_step_in_chat(page)  # a long answer, presented after it was written: scrolled to the step shown
        no_error_toast(page)
    finally:
        context.close()
    assert all(shot.stat().st_size > 10_000 for shot in shots.values())


def check_card_tour(page) -> None:
    """The paper's card opens the guided tour of the step it draws (a cold reader asked for the paper's 80-node step
    legible at 1280x720): seven screens, no text under 20 px, nothing cut off; Escape closes the tour, not the panel."""
    from conftest import walk_tour

    card = page.locator("#tr-sides .tr-side").first
    step = re.search(r"step (\d+) \(", card.locator(".tr-side-did").inner_text()).group(1)
    card.locator(".tr-side-tour").click()
    page.wait_for_selector(".tr-tour.tr-tour-open", timeout=HUNG_MS)
    assert page.locator(".tr-tour-open .tr-tour-step").inner_text().startswith(f"Step {step} of ")
    screens = walk_tour(page)
    assert [s["count"] for s in screens] == [f"{i} / 7" for i in range(1, 8)], screens
    assert "Paper's 80-node tree (the paper's own)" in page.locator(".tr-tour-open .tr-tour-note").first.inner_text()
    for s in screens:
        assert s["smallest"] >= 20 and s["cut"] == [] and s["onNav"] == [] and s["stage"] == [1280, 720], s
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.querySelector('.tr-tour.tr-tour-open')", timeout=HUNG_MS)
    assert page.evaluate(SIDES_OPEN_JS)


def race_trace(steps: int = 8, step_ms: float = 250.0) -> Trace:
    """A trace measured at 1.5x whose answer carries markup: 8 steps of 3 tokens, 250 ms each (plain: 3 s)."""
    from dataclasses import asdict

    from studio.meter import SpeedEstimate

    trace = Trace(model="tiny", settings={"template": "tiny", "k": 2}, messages=[{"role": "user", "content": "go"}])
    vocab = {t: f" w{t}" for t in range(10)}
    for i in range(steps):
        ev = _step(i)
        ev.timings = dict(TIMINGS, total=step_ms)
        trace.add_step(ev, vocab.__getitem__)
    trace.step_texts = [f" run{i} <img src=\"http://{LEAK_HOST}/leak{i}.png\">" for i in range(steps)]
    trace.speed = asdict(SpeedEstimate(ratio=1.5, error=0.04, tr_tps=12.0, plain_tps=8.0, mean_accepted=3.0,
                                       tokens=3 * steps, pairs=5, trusted=True, identical=True, covered=3 * steps))
    return trace


RACE_STATE_JS = """() => ({tr: document.querySelector('#tr-race-tr').textContent,
  plain: document.querySelector('#tr-race-plain').textContent,
  trCount: document.querySelector('#tr-race-tr-count').textContent,
  plainCount: document.querySelector('#tr-race-plain-count').textContent})"""


def test_race_fills_both_panes_at_their_recorded_pace_and_ends_complete(app_browser, tmp_path):
    url, browser = app_browser
    trace = race_trace()
    answer = "".join(trace.step_texts)
    context, page, seen, outside = open_page(browser, url)
    try:
        upload_trace(page, trace.save(tmp_path / "race.json"))
        wait_status(page, "Loaded a trace")
        assert not page.locator("#tr-race-tr").is_visible()  # the race opens on the button
        page.locator("#tr-race").click()
        page.wait_for_selector("#tr-race-tr", state="visible", timeout=HUNG_MS)
        t0 = page.evaluate("() => performance.now()")
        samples = []
        while True:
            state = page.evaluate(RACE_STATE_JS)
            samples.append((page.evaluate("() => performance.now()") - t0, state))
            if state["plain"] == answer or samples[-1][0] > 15_000:
                break
            page.wait_for_timeout(80)
        trs, plains = [len(s["tr"]) for _, s in samples], [len(s["plain"]) for _, s in samples]
        assert trs == sorted(trs) and plains == sorted(plains), samples  # text only grows
        assert any(0 < n < len(answer) for n in trs) and any(0 < n < len(answer) for n in plains)  # in real time
        assert any(s["tr"] == answer and s["plain"] != answer for _, s in samples)  # 2.0 s against 3.0 s: TR first
        final = page.evaluate(RACE_STATE_JS)
        assert final["tr"] == answer and final["plain"] == answer, final  # complete, markup shown as text
        assert final["trCount"].endswith("step 8 of 8 · 24 tokens · done in 2.00 s"), final
        assert final["plainCount"].endswith("token 24 of 24 · done in 3.00 s"), final
        assert "1.50× ± 0.04" in page.locator("#tr-race-caption").inner_text()
        assert page.locator("#tr-race-box img").count() == 0 and page.evaluate(DOM_LEAK_JS) == []
        assert leaks(seen, outside) == []
        no_error_toast(page)
    finally:
        context.close()


def test_a_deep_trees_legend_and_labels_land_where_the_figure_placed_them(app_browser, tmp_path):
    """Plotly.js draws the legend of a deep copied run under the plot, in the room tree_figure left for it
    (present.tree.legend_px), and no label drawn overlaps another or the legend."""
    from test_figures import deep_run_event, words_of
    from present.tree import TREE_WIDTH, tree_figure

    ev = deep_run_event(16)
    fig = tree_figure(ev, words_of).to_plotly()
    fig.update_layout(width=TREE_WIDTH)
    page_file = tmp_path / "tree.html"
    fig.write_html(page_file, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
    context = app_browser[1].new_context(viewport={"width": TREE_WIDTH + 40, "height": 460})  # its Chromium only
    try:
        page = context.new_page()
        page.goto(page_file.as_uri())
        page.wait_for_selector(".legend .bg")
        svg = page.locator(".main-svg").first.bounding_box()
        legend = page.locator(".legend .bg").first.bounding_box()
        plot = page.locator(".draglayer .nsewdrag").first.bounding_box()
        texts = [b for b in (t.bounding_box() for t in page.locator(".scatterlayer .textpoint text").all()) if b]
    finally:
        context.close()
    assert plot["y"] + plot["height"] <= legend["y"] + 2, (plot, legend)  # under the plot
    assert legend["y"] + legend["height"] <= svg["y"] + svg["height"] + 2, (legend, svg)  # and inside the figure
    rects = [(t["x"], t["y"], t["x"] + t["width"], t["y"] + t["height"]) for t in texts]
    assert len(rects) >= len(ev.accepted)  # the path's labels and the bonus's, and a few drafts'
    legend_abs = (legend["x"], legend["y"], legend["x"] + legend["width"], legend["y"] + legend["height"])
    for i, a in enumerate(rects):
        assert not (a[0] < legend_abs[2] and legend_abs[0] < a[2] and a[1] < legend_abs[3] and legend_abs[1] < a[3]), a
        for b in rects[i + 1:]:
            assert not (a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1), (a, b)


WORDS_BEFORE = 1315  # visible words after this answer before the details moved behind "Details" (2026-12-06)
WORDS_JS = "() => (document.body.innerText.match(/\\S+/g) || []).length"


def test_after_an_answer_the_page_shows_half_the_words_and_the_details_on_demand(app_browser):
    """Issue 55: the main page's visible text after an answer is at most half of what it was; the full step story,
    the full cost panel, the warm-start note and the microscope come back with one click, and go again."""
    url, browser = app_browser
    context, page, _, _ = open_page(browser, url)
    try:
        page.locator("#tr-msg textarea").fill("Name three prime numbers.")
        page.locator("#tr-msg textarea").press("Enter")
        wait_meter_final(page, ("measured", "noisy", "off"))
        wait_idle(page)
        words = page.evaluate(WORDS_JS)
        print(f"visible words after an answer: {words} ({words / WORDS_BEFORE:.0%} of {WORDS_BEFORE})")
        assert words <= WORDS_BEFORE // 2
        assert not page.locator("#tr-microscope").is_visible() and page.locator(".tr-cost-brief").is_visible()
        page.locator("#tr-micro-btn").click()
        page.wait_for_selector("#tr-microscope", state="visible", timeout=HUNG_MS)
        assert page.locator(".tr-cost-full").is_visible() and page.locator("#tr-warm").is_visible()
        assert page.evaluate(WORDS_JS) > 1.5 * words
        page.locator("#tr-micro-btn").click()
        page.wait_for_selector("#tr-microscope", state="hidden", timeout=HUNG_MS)
    finally:
        context.close()


def test_the_guided_tour_of_a_live_answer_and_of_a_loaded_trace_at_1280x720(app_browser, tmp_path):
    """Issue 55: from an answer just written and from a loaded trace, the tour's seven screens at 1280x720, moved
    with the keys: no text under 20 px, nothing cut off, the step the page shows; Escape gives the page back."""
    from conftest import walk_tour

    url, browser = app_browser
    context, page, _, outside = open_page(browser, url)
    shot = os.environ.get("TR_TOUR_SCREENSHOT")
    try:
        page.set_viewport_size({"width": 1280, "height": 720})
        page.locator("#tr-msg textarea").fill("Name three prime numbers.")
        page.locator("#tr-msg textarea").press("Enter")
        wait_meter_final(page, ("measured", "noisy", "off"))
        wait_idle(page)
        shown = re.search(r"Showing step (\d+) of (\d+)", status_text(page))
        for source in ("live", "loaded"):
            page.locator("#tr-tour-btn").click()
            page.wait_for_selector(".tr-tour.tr-tour-open", timeout=HUNG_MS)
            label = page.locator(".tr-tour-open .tr-tour-step").inner_text()
            if source == "live":
                assert label == f"Step {shown.group(1)} of {shown.group(2)}", (label, status_text(page))
            if shot and source == "live":
                page.keyboard.press("ArrowRight")
                page.keyboard.press("ArrowRight")
                page.screenshot(path=shot)
                page.keyboard.press("Home")
            screens = walk_tour(page)
            assert [s["count"] for s in screens] == [f"{i} / 7" for i in range(1, 8)], screens
            assert screens[0]["title"] == "Plain decoding keeps one token" and screens[-1]["title"] == "What it bought"
            for s in screens:
                assert s["smallest"] >= 20 and s["cut"] == [] and s["onNav"] == [] and s["stage"] == [1280, 720], s
                assert len(s["words"].split()) <= 30, s["words"]
            page.keyboard.press("Escape")
            page.wait_for_selector(".tr-tour.tr-tour-open", state="detached", timeout=HUNG_MS)
            if source == "live":
                path = tmp_path / "race.json"
                race_trace().save(path)
                upload_trace(page, path)
                wait_status(page, "Loaded a trace")
        no_error_toast(page)
        assert outside == []
    finally:
        context.close()
