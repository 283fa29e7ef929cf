"""The offline HTML replay (present/replay.py): self-contained, every step, escaped; then a real Chromium with
every network request blocked steps through it. `python -m present replay` writes the same file from a trace saved by `generate --trace`.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import TINY_VOCAB, TinyTokenizer, tiny_model
from present.microscope import microscope_blocks, render_blocks, step_microscope
from present.tour import telling_step, tour_screens
from present.replay import replay_html
from present.story import step_story
from studio.recording import record_live
from tr_core.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
SHOT = Path(os.environ.get("TR_REPLAY_SCREENSHOT", "/tmp/replay.png"))
PAYLOADS = ('<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=2</script>",
            "</script><script>window.__pwned=3</script>", "<!--", '<a href="https://example.com/x">x</a>')
PAYLOAD = " ".join(PAYLOADS)


@pytest.fixture(scope="module")
def tiny_trace() -> Trace:
    """A trace recorded the way the studio records one: a tiny random Llama, the paper's 2.2.2 tree."""
    from tr_core import DecodeConfig, Engine

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    messages = [{"role": "user", "content": "hello there, tell me a story"}]
    trace = Trace(model="tiny llama", settings={"template": "2.2.2", "k": 8}, messages=messages)
    cfg = DecodeConfig(max_new_tokens=40, template="2.2.2", provenance=True)  # the studio asks for provenance
    for _ in record_live(engine, engine.encode_chat(messages), cfg, trace, every_s=0.05):
        pass
    trace.record_texts(engine.token_text)
    assert len(trace.steps) >= 4 and len(trace.step_texts) == len(trace.steps)
    return trace


def hostile(trace: Trace) -> Trace:
    """The same steps with markup in the model name, the messages, every token's text and every step's text."""
    bad = copy.deepcopy(trace)
    bad.model = f"tiny {PAYLOAD}"
    bad.messages = [{"role": "system", "content": PAYLOAD}, {"role": "user", "content": f"hi {PAYLOAD}"}]
    bad.token_texts = {t: f"{PAYLOADS[t % len(PAYLOADS)]}{t}" for t in bad.token_texts}
    bad.step_texts = [f"{PAYLOADS[i % len(PAYLOADS)]} run{i}\n" for i in range(len(bad.steps))]
    return bad


class Tags(HTMLParser):
    """Every start tag with its attributes; the text of script blocks by their id."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self.scripts.append((dict(attrs), ""))

    def handle_data(self, data):
        if self.tags and self.tags[-1][0] == "script" and self.scripts:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


def parse(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    return parser


def outside_plotly(page: str) -> str:
    """The page without the inlined plotly.js (whose own strings name plotly's web site)."""
    start = page.index('<script id="tr-plotly">')
    return page[:start] + page[page.index("</script>", start):]


def step_data(page: str) -> dict:
    return json.loads(dict((a.get("id"), t) for a, t in parse(page).scripts)["tr-data"])


# ------------------------------------------------------------------------------------------------ unit


def test_replay_is_one_self_contained_file_with_every_step(tiny_trace):
    page = replay_html(tiny_trace)
    assert page.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in page and "default-src 'none'" in page
    rest = outside_plotly(page)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", rest, re.I), "a reference to the network"
    assert "https://" not in rest and "http://" not in rest and "@import" not in rest and "url(" not in rest
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs()[:2000] in page  # plotly.js itself is inside
    data = step_data(page)
    n = len(tiny_trace.steps)
    assert len(data["steps"]) == n and f'max="{n}"' in page
    for ev, step in zip(tiny_trace.steps, data["steps"]):
        assert step["tree"]["data"] and step["heat"]["data"] and step["emitted"] == len(ev.emitted)
        assert step["tree"]["layout"]["title"]["text"].startswith(f"Step {ev.step + 1}:")
    assert data["steps"][0]["story"] == step_story(tiny_trace.steps[0], tiny_trace.token_text, {})
    runs = [t for t, a in parse(page).tags if t == "span" and "run" in a.get("class", "")]
    assert len(runs) == n and "tiny llama" in page and "hello there, tell me a story" in page
    from present.replay import summary_line

    hybrid = copy.deepcopy(tiny_trace)
    hybrid.settings["template"], hybrid.summary = "hybrid", None
    assert "tree hybrid (matrix + context)" in summary_line(hybrid)  # the studio's switch names it so
    assert "(matrix + context)" not in summary_line(tiny_trace)


def test_replay_holds_the_microscope_of_every_step(tiny_trace):
    data = step_data(replay_html(tiny_trace))
    for i, step in enumerate(data["steps"]):  # the same blocks the studio renders with microscope_view
        assert step["microscope"] == microscope_blocks(step_microscope(tiny_trace, i))
    reads = [s["microscope"]["k"][1] for s in data["steps"]]
    assert any("rows of the adjacency matrix" in render_blocks(b) for b in reads), "no step read a row"


def test_replay_needs_no_tokenizer_and_tr_core_does_not_import_plotly(tiny_trace):
    loaded = Trace.from_dict(json.loads(json.dumps(tiny_trace.to_dict())))  # the trace file alone
    assert step_data(replay_html(loaded)) == step_data(replay_html(tiny_trace))
    code = ("import sys, tr_core, present.story, present.replay; "
            "assert 'plotly' not in sys.modules, 'plotly imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_markup_in_a_trace_is_text_never_live(tiny_trace):
    page = replay_html(hostile(tiny_trace))
    tags = parse(page)
    assert {t for t, _ in tags.tags} <= {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "p",
                                         "small", "nav", "button", "input", "span", "main", "section", "div",
                                         "details", "summary", "footer", "script"}
    assert [a.get("id") or a.get("type") for a, _ in tags.scripts] == ["tr-plotly", "tr-data", None]
    assert not [(t, k) for t, a in tags.tags for k in a if k.startswith("on")]  # no event handler attributes
    data_block = dict((a.get("id"), t) for a, t in tags.scripts)["tr-data"]
    assert "<" not in data_block and ">" not in data_block  # no '</script>' or '<!--' can end or bend the block
    assert "&lt;img src=x onerror=" in page and "&lt;script&gt;window.__pwned=2&lt;/script&gt;" in page
    assert page.count("<script") == 3 and page.count("</script>") == 3
    assert "PAYLOAD" not in page and "<img" not in outside_plotly(page)
    assert any("<img" in s["story"] for s in step_data(page)["steps"])  # the story keeps the text, shown as text


def test_cli_generate_saves_the_trace_and_present_draws_its_replay(tmp_path):
    from present.__main__ import main as present_main
    from test_bench import _tiny_model_folder
    from tr_core.cli import main

    folder = _tiny_model_folder(tmp_path / "tiny")
    saved, out = tmp_path / "answer.json", tmp_path / "answer.html"
    assert main(["generate", "--prompt", "Tell me <b>a</b> story.", "--model", str(folder), "--device", "cpu",
                 "--max-new-tokens", "16", "--template", "2.2.2", "--json", "--trace", str(saved)]) == 0
    assert present_main(["replay", str(saved), str(out)]) == 0
    assert present_main(["replay", str(tmp_path / "missing.json"), str(tmp_path / "x.html")]) == 1
    page = out.read_text(encoding="utf-8")
    data = step_data(page)
    assert data["steps"] and any("drafted" in step["story"] for step in data["steps"])
    assert "Tell me &lt;b&gt;a&lt;/b&gt; story." in page
    assert main(["generate", "--prompt", "hi", "--model", str(folder), "--device", "cpu", "--max-new-tokens", "2",
                 "--trace", str(tmp_path / "no" / "such" / "dir.json")]) == 2  # refused before any work


# --------------------------------------------------------------------------------------------- browser

CHROMIUM = os.environ.get("TR_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
browser_only = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")

SHOWN_JS = """() => ({
  story: document.querySelector('#tr-story').textContent,
  title: (document.querySelector('#tr-tree .gtitle') || {}).textContent || '',
  nodes: document.querySelectorAll('#tr-tree .scatterlayer .point').length,
  current: [...document.querySelectorAll('#tr-answer .run.current')].map(e => e.dataset.step),
  label: document.querySelector('#tr-step-label').textContent,
  microscope: document.querySelector('#tr-microscope').textContent,
  microscopeTags: [...document.querySelectorAll('#tr-microscope *')].map(e => e.tagName.toLowerCase()),
  slider: document.querySelector('#tr-step').value,
  titlesInside: ['#tr-tree', '#tr-heat'].every(id => {  // no title drawn above its figure's top edge
    const svg = document.querySelector(id + ' .main-svg'), title = document.querySelector(id + ' .gtitle');
    return !!title && title.getBoundingClientRect().top >= svg.getBoundingClientRect().top;
  }),
})"""


@pytest.fixture(scope="module")
def offline_page():
    """Open a file in Chromium with every request but the file itself aborted; yields open(path) -> (page, asked)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        contexts = []

        def open_file(path: Path, figures: bool = True):
            context = browser.new_context(viewport={"width": 1280, "height": 720}, device_scale_factor=1)
            contexts.append(context)
            page = context.new_page()
            url = path.resolve().as_uri()
            asked: list[str] = []
            page.on("request", lambda req: asked.append(req.url))
            page.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url, wait_until="load")
            if figures:
                page.wait_for_selector("#tr-tree .main-svg", timeout=30_000)
                page.wait_for_selector("#tr-heat .main-svg", timeout=30_000)
            return page, asked, errors

        try:
            yield open_file
        finally:
            for context in contexts:
                context.close()
            browser.close()


@browser_only
def test_replay_steps_offline_in_chromium(tiny_trace, tmp_path, offline_page):
    path = tmp_path / "replay.html"
    path.write_text(replay_html(tiny_trace), encoding="utf-8")
    page, asked, errors = offline_page(path)
    opened = page.evaluate(SHOWN_JS)  # the telling step first, as the studio shows it (present.tour.telling_step)
    assert opened["current"] == [str(telling_step(tiny_trace))]
    page.keyboard.press("Home")
    page.wait_for_function("() => document.querySelector('#tr-tree .gtitle').textContent.startsWith('Step 1:')")
    first = page.evaluate(SHOWN_JS)
    assert first["current"] == ["0"] and first["label"].startswith("Step 1 of") and first["title"].startswith("Step 1:")
    assert first["story"] == step_story(tiny_trace.steps[0], tiny_trace.token_text, {}) and first["nodes"] >= 2
    assert page.locator("#tr-prev").is_disabled()
    page.click("#tr-next")
    page.click("#tr-next")
    page.wait_for_function("() => document.querySelector('#tr-tree .gtitle').textContent.startsWith('Step 3:')")
    third = page.evaluate(SHOWN_JS)
    assert third["current"] == ["2"] and third["slider"] == "3" and third["label"].startswith("Step 3 of")
    assert third["story"].startswith("Step 3 drafted") and third["story"] != first["story"]
    assert first["microscope"].startswith("Step 1 under the microscope")
    assert third["microscope"].startswith("Step 3 under the microscope") and "① Read" in third["microscope"]
    assert set(third["microscopeTags"]) <= {"div", "span", "details", "summary"}
    assert first["titlesInside"] and third["titlesInside"]
    assert page.locator("#tr-answer .run.future").count() == len(tiny_trace.steps) - 3
    page.keyboard.press("ArrowLeft")  # the keyboard moves the same control
    assert page.evaluate(SHOWN_JS)["current"] == ["1"]
    page.keyboard.press("End")
    last = page.evaluate(SHOWN_JS)
    assert last["current"] == [str(len(tiny_trace.steps) - 1)] and page.locator("#tr-next").is_disabled()
    page.keyboard.press("Home")
    page.click("#tr-next")
    page.click("#tr-next")
    page.wait_for_timeout(300)
    SHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOT))
    assert errors == [] and asked == [path.resolve().as_uri()], (errors, asked)
    # no toolbar button that would upload a figure (plotly's "Share chart..." opens plotly's cloud)
    titles = page.evaluate("() => [...document.querySelectorAll('.modebar-btn')].map(b => b.getAttribute('data-title'))")
    assert titles and not any("cloud" in (t or "").lower() or "share" in (t or "").lower() for t in titles), titles


@browser_only
def test_a_replay_of_no_steps_says_so_and_offers_no_step_to_go_to(tiny_trace, tmp_path, offline_page):
    from dataclasses import replace

    empty = replace(tiny_trace, steps=[], step_texts=[], summary=None)  # e.g. stopped before its first step
    path = tmp_path / "empty.html"
    path.write_text(replay_html(empty), encoding="utf-8")
    page, asked, errors = offline_page(path, figures=False)
    page.wait_for_function("() => document.querySelector('#tr-story').textContent !== ''")
    shown = page.evaluate("() => [document.querySelector('#tr-story').textContent, "
                          "document.querySelector('#tr-step-label').textContent]")
    assert shown == ["This trace has no steps.", "No steps"]
    assert all(page.locator(s).is_disabled() for s in ("#tr-prev", "#tr-next", "#tr-step"))
    assert errors == []


@browser_only
def test_hostile_replay_runs_no_script_and_shows_markup_as_text(tiny_trace, tmp_path, offline_page):
    path = tmp_path / "hostile.html"
    path.write_text(replay_html(hostile(tiny_trace)), encoding="utf-8")
    story = step_data(path.read_text(encoding="utf-8"))["steps"][3]["story"]
    assert re.search(r"<(img|script|/script|!--|a )", story), story
    page, asked, errors = offline_page(path)
    page.keyboard.press("Home")  # it opens at the telling step
    for _ in range(3):
        page.click("#tr-next")
        page.mouse.move(640, 300)  # hover the tree: labels are drawn from token text too
    page.wait_for_timeout(500)
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    assert page.locator("img, iframe, object, embed, a[href]").count() == 0
    assert "<img src=x" in page.locator("#tr-answer").inner_text()
    shown = page.evaluate(SHOWN_JS)
    assert shown["story"] == story  # the markup in the story is text
    assert re.search(r"<(img|script|/script|!--|a␣)", shown["microscope"]), shown["microscope"]  # so in the microscope
    assert set(shown["microscopeTags"]) <= {"div", "span", "details", "summary"}
    assert "<img src=x" in page.title() and page.locator("details .body").count() == 2
    page.click("#tr-tour-btn")  # the tour draws every token's text too: as text
    for _ in range(7):
        page.keyboard.press("ArrowRight")
    assert page.evaluate("() => typeof window.__pwned") == "undefined" and page.locator("img, script[src]").count() == 0
    assert re.search(r"<(img|script|/script|!--|a␣)", page.locator(".tr-tour-open").text_content())  # cut, as text
    assert errors == [] and asked == [path.resolve().as_uri()], (errors, asked)


@browser_only
def test_the_guided_tour_works_offline_at_1280x720(tiny_trace, tmp_path, offline_page):
    """From the replay file: the tour of the step shown, seven screens moved with the keys, no text under 20 px,
    nothing cut off, Escape closes it and the arrow keys step the replay again; another step gets its own tour."""
    from conftest import walk_tour

    path = tmp_path / "replay.html"
    path.write_text(replay_html(tiny_trace), encoding="utf-8")
    page, asked, errors = offline_page(path)
    page.click("#tr-tour-btn")
    screens = walk_tour(page)
    telling = telling_step(tiny_trace)
    assert [s["title"] for s in screens] == [s.title for s in tour_screens(tiny_trace, telling)]
    assert [s["count"] for s in screens] == [f"{i} / 7" for i in range(1, 8)]
    for s in screens:
        assert s["smallest"] >= 20 and s["cut"] == [] and s["onNav"] == [] and s["stage"] == [1280, 720], s
    page.keyboard.press("Escape")
    assert page.evaluate("() => document.querySelector('.tr-tour.tr-tour-open')") is None
    page.keyboard.press("Home")
    page.click("#tr-tour-btn")
    assert page.locator(".tr-tour-open .tr-tour-step").inner_text() == f"Step 1 of {len(tiny_trace.steps)}"
    assert errors == [] and asked == [path.resolve().as_uri()], (errors, asked)
