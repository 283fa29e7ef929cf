"""The one glossary (present/glossary.py): every term of the method in one sentence, marked where the page uses it."""
from __future__ import annotations

import html
import re

from present.glossary import TERMS, gloss, glossary_html

MARK = re.compile(r'<span class="tr-term" tabindex="0" data-tip="([^"]*)">(.*?)</span>')


def test_every_term_is_one_short_sentence():
    assert len({t.name for t in TERMS}) == len(TERMS)
    for term in TERMS:
        assert term.sentence.endswith(".") and ". " not in term.sentence[:-1], term.name
        assert len(term.sentence.split()) <= 32, term.name


def test_the_jargon_a_lecturer_met_cold_is_explained_where_it_is_used():
    """The terms the cold reading found unexplained (issue 55) each get their sentence on hover or tap."""
    for words in ("bonus token", "forward", "depth", "top-8", "k = 8", "sample answers learned beforehand",
                  "learned beforehand", "hybrid", "short turns",
                  "one standard error", "tokens per step", "matrix + context", "exact mode", "near tie"):
        marks = MARK.findall(gloss(f"Here {words} is used."))
        assert marks and words.split()[-1] in marks[0][1] and marks[0][0], words


def test_gloss_escapes_hostile_text_and_marks_each_term_once():
    shown = gloss("<script>alert('forward')</script> one forward, two forwards & a \"bonus\"")
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "&amp;" in shown
    marks = MARK.findall(shown)
    assert [m[1] for m in marks] == ["forward", "bonus"]  # the first unquoted use of each; 'forward' is a token
    assert html.unescape(re.sub(r"<[^>]+>", "", shown)) == "<script>alert('forward')</script> one forward, two " \
                                                          "forwards & a \"bonus\""


def test_a_quoted_token_is_the_models_word_not_a_term():
    shown = gloss("The row of '␣forward' was read; the forward checked it.")
    assert [m[1] for m in MARK.findall(shown)] == ["forward"] and "'␣forward'" in html.unescape(shown)
    assert shown.index("tr-term") > shown.index("read")


def test_the_glossary_panel_lists_every_term_with_the_same_sentence():
    panel = glossary_html()
    for term in TERMS:
        assert f"<dt>{html.escape(term.name)}</dt><dd>{html.escape(term.sentence)}</dd>" in panel


def test_the_jargon_a_lecturer_met_cold_is_gone_from_the_glossary_and_its_plain_words_are_in_it():
    """Issue 55 again: "warm start" and "chunk pairs" gave way to plain words; the glossary explains those words
    and no longer the jargon, so a page that still said it would show it unexplained (and a test would see it)."""
    names = " ".join(t.name for t in TERMS).lower()
    assert "warm" not in names and "chunk" not in names
    for jargon in ("warm start", "warm-start answers", "chunk pairs"):
        assert not MARK.findall(gloss(f"Here {jargon} is used.")), jargon
    from present.nodes import LEARNED
    from studio.views import left_out_note

    assert MARK.findall(gloss(f"3 copied from {LEARNED}."))  # the words the story uses are the glossary's
    assert "chunk" not in left_out_note(2) and MARK.findall(gloss("timed in 21 short turns each"))
