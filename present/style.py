"""What every view shares: the colours of the groups of a step's tree, the smallest font, and tokens made visible.

Colours are chosen for a projector: strong for what was accepted, muted for what was rejected; no text is smaller
than MIN_FONT, so that the back row of a lecture hall can read it.
"""
from __future__ import annotations

import html
import re
from typing import Callable

from tr_core.token_text import BYTES_CLOSE, BYTES_OPEN

TokenText = Callable[[int], str]  # a token id -> its text (Trace.token_text, a tokenizer's decode of one id)

ROOT_COLOUR = "#1e3a8a"
ACCEPTED_COLOUR = "#16a34a"
BONUS_COLOUR = "#f59e0b"  # orange means the bonus token, nothing else
CURRENT_COLOUR = "#db2777"  # the step shown: its bar in the chart, its run in the chat (CSS: studio.css, replay.py)
MARK_COLOUR = "#7c3aed"  # a candidate new in its matrix row (the tour; the microscope's .trm-new)
REJECTED_COLOUR = "#cbd5e1"
PAST_END_COLOUR = "#86efac"  # accepted drafts the answer did not keep: its end (a stop token, the limit) came first
REJECTED_TEXT = "#64748b"  # grey text: notes, captions, rejected drafts
EDGE_COLOUR = "#cbd5e1"
MIN_FONT = 16  # px: no text in the tree or the heatmap is smaller, so a lecture hall's back row can read it

SYMBOL_NOTES = {"␣": "␣ = space", "↵": "↵ = new line", "⇥": "⇥ = tab", "∅": "∅ = empty token",  # a note explains
                BYTES_OPEN: f"{BYTES_OPEN}e4{BYTES_CLOSE} = a byte of a split character"}  # those shown


def visible_token(text: str, max_len: int = 10) -> str:
    """A token string as a label shows it (not HTML-escaped yet): spaces '␣', newlines '↵', tabs '⇥', cut to
    max_len (a special token that would be cut: its short sign, `short_special`; one that fits stays whole)."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if shown == "":
        shown = "∅"
    if len(shown) <= max_len:
        return shown
    sign = short_special(text)  # a tokenizer's marker too long to show whole: its sign, as the heatmap's ("‹end›",
    return sign if sign != text and len(sign) <= max_len else shown[: max_len - 1] + "…"  # not "<|im_…")


SPECIAL = re.compile(r"<\|?(/?)(?:[A-Za-z0-9]+_)*([A-Za-z0-9]+)\|?>")  # a tokenizer's marker: <|im_end|>, </s>
# a character's width in em in a sans-serif face (the heatmap's 16 px cells): narrow, wide and capital letters apart
NARROW, WIDE = set("iljtfrI.,:;'|!()[]{} "), set("mwMW@%…—")


def short_special(text: str) -> str:
    """A special token as a short sign ("<|im_end|>" -> "‹end›", "</s>" -> "‹/s›"); any other text unchanged."""
    m = SPECIAL.fullmatch(text)
    return f"‹{m[1]}{m[2]}›" if m else text


def text_em(text: str) -> float:
    """About how wide `text` is in em, in a sans-serif face (a cell's label must fit its cell)."""
    return sum(0.3 if c in NARROW else 0.9 if c in WIDE else 0.75 if c in "↵⇥" else 0.66 if c.isupper() else 0.54
               for c in text)


def fit_token(text: str, max_em: float, mono: bool = False) -> str:
    """A token as a cell or row label shows it (not HTML-escaped yet): visible_token of its short sign, cut with '…'
    where it is wider than `max_em` (`mono`: in a monospaced face, 0.6 em a character); hover has the whole token."""
    shown = visible_token(short_special(text), 99)
    width = (lambda t: 0.6 * len(t)) if mono else text_em  # noqa: E731
    if width(shown) <= max_em:
        return shown
    while len(shown) > 1 and width(shown + "…") > max_em:
        shown = shown[:-1]
    return shown + "…"


def node_label(text: str, max_len: int) -> str:
    """A tree node's label (not HTML-escaped yet): visible_token, and a lone punctuation mark in curly quotes (a ','
    was a speck a lecture hall could not see, '_' read as the space sign; straight quotes would triple an
    apostrophe)."""
    shown = visible_token(text, max_len)
    return f"“{shown}”" if len(shown) == 1 and not shown.isalnum() and shown not in "␣↵⇥∅" else shown


def display_token(text: str, max_len: int = 10) -> str:
    """Make a token string visible in a label: spaces as '␣', newlines as '↵', tabs as '⇥', cut to max_len."""
    return html.escape(visible_token(text, max_len), quote=False)  # plotly renders a subset of HTML: show text


def symbol_note(texts: list[str]) -> str:
    """'␣ = space · ↵ = new line' for the symbols that occur in some of the texts ('' if none)."""
    return " · ".join(note for s, note in SYMBOL_NOTES.items() if any(s in t for t in texts))
