"""The README's pictures, all from ONE answer in one session, so that every figure in them agrees.

Launches `app.py` on a free port, asks one example question in Chromium (Playwright), and saves into assets/:
  screenshot.png    the page after the answer (1600 px wide, the question in sight)
  tour.png          six of the guided tour's seven 1280x720 screens of the step the page shows, in a 2 x 3 grid
  side_by_side.png  the paper vs the hybrid, on the same question (its panel over the presentation view, 1280x720)
  paper_tour.png    the tour of the paper's card: the rows it read, its 80-node tree, its verdict and mask, its cost
  presentation.png  the presentation view at 1280x720, the same answer
  microscope.png    the step the page shows, under the microscope (over the presentation view, 1280x720)
Needs Chromium (Debian's `chromium`) and Playwright; takes 3-4 minutes on 2 cores.

    python scripts/readme_pictures.py [--example Conversation] [--out assets]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from crowd import free_port, launch  # noqa: E402 - the crowd script's app launcher, here not in public mode

WAIT_MS = 1_800_000  # a hung app fails instead of blocking forever; no estimate of how long an answer takes
FINAL_JS = ("() => { const m = document.querySelector('#tr-meter');"
            " return !!(m && ['measured', 'noisy', 'off'].includes(m.dataset.state)); }")
IDLE_JS = "() => !document.querySelector('.gradio-container .wrap.generating, .gradio-container .wrap.pending')"
TOUR_SCREENS = (0, 1, 3, 4, 5, 6)  # the seven screens but the third (the tree before the verdict, as the fourth)


def wait_up(page, url: str) -> None:
    for _ in range(150):
        try:
            page.goto(url, wait_until="load", timeout=10_000)
            page.wait_for_selector("#tr-msg textarea", timeout=30_000)
            return
        except Exception:  # noqa: BLE001 - the app is still starting
            page.wait_for_timeout(2000)
    raise RuntimeError(f"the app at {url} did not come up")


def answer(page, example: str) -> None:
    page.locator("#tr-examples button", has_text=example).first.click()
    page.wait_for_function(FINAL_JS, timeout=WAIT_MS)
    page.wait_for_function(IDLE_JS, timeout=WAIT_MS)


def tour_grid(page, out: Path, tmp: Path) -> None:
    """Open the tour of the shown step at 1280x720, shoot its screens, and tile six at half size."""
    from PIL import Image

    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("#tr-tour-btn").click()
    page.wait_for_selector(".tr-tour.tr-tour-open", timeout=WAIT_MS)
    shots = []
    for i in range(7):
        page.wait_for_timeout(400)  # the screen's transition
        shots.append(tmp / f"tour{i}.png")
        page.screenshot(path=str(shots[-1]))
        page.keyboard.press("ArrowRight")
    page.keyboard.press("Escape")
    w, h, gap = 640, 360, 12
    grid = Image.new("RGB", (2 * w + gap, 3 * h + 2 * gap), "#0f172a")
    for j, i in enumerate(TOUR_SCREENS):
        tile = Image.open(shots[i]).convert("RGB").resize((w, h), Image.LANCZOS)
        grid.paste(tile, ((j % 2) * (w + gap), (j // 2) * (h + gap)))
    grid.save(out / "tour.png", optimize=True)


def presenting(page, out: Path) -> None:
    """The presentation view at 1280x720 (16:9, as projected), then over it the microscope and the paper vs the
    hybrid, each shot as the whole screen a hall sees."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("#tr-present").click()
    page.wait_for_timeout(1500)  # the plots resize to their cells
    page.mouse.move(800, 705)  # over the status line: no plot, so no plot toolbar shows
    page.screenshot(path=str(out / "presentation.png"))
    page.locator("#tr-micro-btn").click()
    page.wait_for_selector("#tr-microscope", state="visible", timeout=WAIT_MS)
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "microscope.png"))
    page.locator("#tr-micro-btn").click()
    page.locator("#tr-compare-methods").click()
    page.wait_for_selector("#tr-sides .tr-sides-open", timeout=WAIT_MS)
    page.wait_for_function(IDLE_JS, timeout=WAIT_MS)
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "side_by_side.png"))


PAPER_SCREENS = (1, 2, 3, 6)  # the paper's card's tour: rows read, its tree, one forward checks it, what it bought


def paper_tour(page, out: Path, tmp: Path) -> None:
    """Open the tour of the paper's card (the side-by-side's first) at 1280x720 and tile four of its screens, 2 x 2."""
    from PIL import Image

    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("#tr-sides .tr-side-tour").first.click()
    page.wait_for_selector(".tr-tour.tr-tour-open", timeout=WAIT_MS)
    tiles = []
    for i in range(max(PAPER_SCREENS) + 1):
        page.wait_for_timeout(400)
        if i in PAPER_SCREENS:
            tiles.append(tmp / f"paper{i}.png")
            page.screenshot(path=str(tiles[-1]))
        page.keyboard.press("ArrowRight")
    page.keyboard.press("Escape")
    w, h, gap = 640, 360, 12
    grid = Image.new("RGB", (2 * w + gap, 2 * h + gap), "#0f172a")
    for j, shot in enumerate(tiles):
        grid.paste(Image.open(shot).convert("RGB").resize((w, h), Image.LANCZOS), ((j % 2) * (w + gap),
                                                                                   (j // 2) * (h + gap)))
    grid.save(out / "paper_tour.png", optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="Conversation", help="the example button to click")
    ap.add_argument("--out", default=str(ROOT / "assets"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the app (0: its default); on a 2-core "
                    "machine 1 leaves Chromium a core of its own, as a visitor's browser has on a Space")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    extra = ("--threads", str(args.threads)) if args.threads else ()
    app, url = launch(port, public=False, extra=extra), f"http://127.0.0.1:{port}/"
    try:
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as tmp:
            browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
            wait_up(page, url)
            answer(page, args.example)
            page.mouse.move(5, 5)
            page.locator("#tr-chat .message-row.user-row").last.scroll_into_view_if_needed()
            page.screenshot(path=str(out / "screenshot.png"), full_page=True)
            tour_grid(page, out, Path(tmp))
            presenting(page, out)
            paper_tour(page, out, Path(tmp))
            browser.close()
    finally:
        app.terminate()
        app.wait(timeout=60)
    print("saved", ", ".join(str(out / n) for n in ("screenshot.png", "microscope.png", "tour.png",
                                                     "side_by_side.png", "paper_tour.png", "presentation.png")))


if __name__ == "__main__":
    main()
