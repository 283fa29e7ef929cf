"""The answer as markdown: untrusted text made inert (no live HTML, images or links), and each step's accepted run
in a soft colour (fenced code blocks too, as escaped HTML), the step shown by the replay outlined."""
from __future__ import annotations

import html
import re
from typing import Callable

# Soft background colours that alternate between the accepted runs of consecutive steps in the chat.
RUN_CLASSES = ("tr-run-a", "tr-run-b")
CURRENT_RUN_CLASS = "tr-run-current"  # the run of the step shown by the replay (outlined in the chat)


def _code_zones(text: str) -> list[tuple[int, int]]:
    """Character ranges of fenced code blocks (``` or ~~~) and inline code spans, where no HTML may go."""
    zones: list[tuple[int, int]] = []
    pos, n = 0, len(text)
    in_fence, fence_start, fence = False, 0, ""
    while pos < n:
        line_end = text.find("\n", pos)
        line_end = n if line_end < 0 else line_end + 1
        stripped = text[pos:line_end].lstrip()
        if in_fence:
            if stripped.startswith(fence):
                zones.append((fence_start, line_end))
                in_fence = False
        elif stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence, fence_start, fence = True, pos, stripped[:3]
        else:
            i = pos
            while i < line_end:
                if text[i] == "`":
                    run = len(text[i:line_end]) - len(text[i:line_end].lstrip("`"))
                    close = text.find("`" * run, i + run, line_end)
                    end = close + run if close >= 0 else line_end
                    zones.append((i, end))
                    i = end
                else:
                    i += 1
        pos = line_end
    if in_fence:
        zones.append((fence_start, n))  # an open fence while streaming: keep it plain
    return zones


_BLOCK_MARKERS = ("#", "-", "*", "+", ">", "|", "=")


def safe_markdown(text: str) -> str:
    """Untrusted text (a message, a model's answer, a trace) as markdown that can hold no live HTML or images."""
    return coloured_markdown(text, [len(text)], colour=False)


_AUTOLINK = re.compile(r"(?i)(://|www\.|@)")  # what a markdown renderer turns into a link of its own accord
_AUTOLINK_INERT = {"://": "&#58;//", "@": "&#64;"}


def _inert(text: str) -> str:
    """Escape HTML and disarm markdown images/links (`![..](..)`, `[..](..)`) in text outside code, and the
    addresses a renderer would link by itself (`http://..`, `www...`, `a@b.c`): written as character references,
    they show the same text but no longer match a link."""
    text = html.escape(text, quote=False).replace("[", "&#91;")
    return _AUTOLINK.sub(lambda m: _AUTOLINK_INERT.get(m.group(1), m.group(1)[:3] + "&#46;"), text)


def coloured_markdown(text: str, boundaries: list[int], colour: bool = True) -> str:
    """Wrap each step's run of text in alternating soft-coloured spans, leaving markdown structure intact.

    `boundaries[i]` is the end offset of step i's text. Spans never enter code (fenced or inline), never
    cross a line break, and never cover a line's leading block marker, so lists, headings, tables and code
    render as they would without colour. Text outside spans keeps its markdown; '<', '&' and '[' are escaped,
    so the text can carry no live HTML and no images (it may come from a visitor, a model or a shared trace).
    colour=False: the same escaping, no spans.
    """
    return marked_markdown(text, boundaries, None, colour)


def marked_markdown(text: str, boundaries: list[int], current: int | None, colour: bool = True) -> str:
    """`coloured_markdown` with step `current`'s run also marked (class "tr-run-current": the step shown in replay;
    None marks none)."""
    def span_class(step: int) -> str:
        cls = RUN_CLASSES[step % 2] if colour else ""
        return f"{cls} {CURRENT_RUN_CLASS}".strip() if step == current else cls

    return run_markdown(text, boundaries, span_class)


CODE_OPEN, CODE_CLOSE = '<pre class="tr-code"><code>', "</code></pre>"  # a fenced block that carries step colours


def _fence_parts(text: str, a: int, b: int) -> tuple[int, int] | None:
    """For the code zone text[a:b] when it is a fenced block opened at most 3 spaces in (so that an HTML block can
    stand in its place): (where its body starts, where its closing fence line starts; b while it is still open)."""
    nl = text.find("\n", a, b)
    body = b if nl < 0 else nl + 1
    line = text[a:body].rstrip("\n")
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or stripped[:3] not in ("```", "~~~"):
        return None
    last = text.rfind("\n", a, b - 1 if text[b - 1] == "\n" else b) + 1  # where the zone's last line starts
    closed = last > a and text[last:b].lstrip().startswith(stripped[:3])
    return body, (last if closed else b)


def _char_modes(text: str, pre: bool) -> list[str]:
    """Each character's part: "md" (markdown text), "code" (code left as markdown: inline, or every fence when not
    `pre`), and for a fenced block shown as coloured HTML, "open" (its opening fence line), "pre" (its body) and
    "close" (its closing fence line)."""
    modes = ["md"] * len(text)
    for a, b in _code_zones(text):
        parts = _fence_parts(text, a, b) if pre else None
        if parts is None:
            modes[a:b] = ["code"] * (b - a)
            continue
        body, close = parts
        modes[a:body] = ["open"] * (body - a)
        modes[body:close] = ["pre"] * (close - body)
        end = b - 1 if close < b and text[b - 1] == "\n" else b  # the closing line's newline stays
        modes[close:end] = ["close"] * (end - close)
    return modes


def _block_lead(piece: str) -> tuple[str, str]:
    """A markdown line's start split as (leading spaces and block marker, the rest): '- ', '## ', '1. ', '> '."""
    stripped = piece.lstrip()
    lead_len = len(piece) - len(stripped)
    marker = ""
    if stripped[:1] in _BLOCK_MARKERS:
        head = stripped.split(" ", 1)[0]
        if head == stripped[0] * len(head):  # a run of one marker character: '-', '##', '>', '==='
            marker = head + (" " if " " in stripped else "")
    elif stripped[:1].isdigit():
        head = stripped.split(" ", 1)[0]
        if head.rstrip(".)").isdigit() and head[-1:] in ".)":
            marker = head + (" " if " " in stripped else "")
    return piece[: lead_len + len(marker)], piece[lead_len + len(marker):]


def _run_piece(text: str, i: int, j: int, mode: str, cls: str) -> str:
    """text[i:j] (one part, no line break) as output in a step's span of class `cls` ("" = none)."""
    piece = text[i:j]
    if mode == "code":
        return piece
    if mode == "open":  # the fence line gives way to the HTML block, its indentation kept (a list item's)
        start = text.rfind("\n", 0, i) + 1
        fence = start + len(text[start:j]) - len(text[start:j].lstrip(" "))  # where the fence's first mark is
        return text[i:min(j, fence)] + (CODE_OPEN if i <= fence < j else "")
    if mode == "close":
        return CODE_CLOSE if text[i - 1] == "\n" else ""
    if mode == "pre":  # inside <pre>: HTML escaped, the indentation outside the span
        lead, body = piece[: len(piece) - len(piece.lstrip())], piece.lstrip()
        body = html.escape(body, quote=False)
        return lead + (f'<span class="{cls}">{body}</span>' if body and cls else body)
    lead = ""
    if i == 0 or text[i - 1] == "\n":
        lead, piece = _block_lead(piece)
    if not (piece.strip() and cls):
        return lead + _inert(piece)
    gap = piece[: len(piece) - len(piece.lstrip(" "))]  # the space before a run's first word stays outside its span:
    # outlined, a run wrapped after it drew an empty box at the line's end (a reader's "stray pink box")
    return lead + gap + f'<span class="{cls}">{_inert(piece[len(gap):])}</span>'


def run_markdown(text: str, boundaries: list[int], span_class: Callable[[int], str]) -> str:
    """Escaped markdown with step i's run in spans of class `span_class(i)` ("" = no span); see coloured_markdown.

    When some run has a class, a fenced code block is written as an HTML block (`<pre class="tr-code">`, its
    language dropped) so that its runs can carry their spans too; inline code stays as it is."""
    modes = _char_modes(text, pre=any(span_class(step) for step in range(len(boundaries))))
    out: list[str] = []
    start = 0
    for step, end in enumerate([*boundaries, len(text)]):
        end = min(end, len(text))
        if end <= start:
            continue
        cls = span_class(step) if step < len(boundaries) else ""
        i = start
        while i < end:
            if text[i] == "\n":
                out.append("" if modes[i] == "open" else "\n")
                i += 1
                continue
            j = i
            while j < end and modes[j] == modes[i] and text[j] != "\n":
                j += 1
            out.append(_run_piece(text, i, j, modes[i], cls))
            i = j
        start = end
    if modes and modes[-1] in ("open", "pre"):  # a fence still open while the answer streams
        out.append(CODE_CLOSE)
    return "".join(out)
