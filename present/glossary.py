"""The one glossary: every term of the method in one sentence, shown on hover or tap wherever the page uses it
(`gloss`), and listed whole in the page's Glossary panel (`glossary_html`)."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    name: str  # as the Glossary panel lists it
    pattern: str  # the words it matches in the page's text (a regular expression, case-insensitive)
    sentence: str  # what it means, in one sentence


TERMS = (
    Term("plain decoding", r"plain decoding", "The model writes one token per forward pass, always its most likely "
         "next token: the baseline every speed here is compared with."),
    Term("forward", r"\bforwards?\b", "One run of the whole model over some tokens; it costs about the "
         "same for 1 token as for a few dozen on a GPU, and more on a CPU."),
    Term("adjacency matrix", r"adjacency matrix|the matrix\b", "A table with one row per vocabulary token, holding "
         "the 8 tokens the model last ranked likeliest right after it: the recycled candidates."),
    Term("top-8 (k = 8)", r"top-8|top-k|\bk = 8\b", "The 8 likeliest next tokens of one model output; k = 8 is how "
         "many candidates each matrix row keeps."),
    Term("draft tree", r"draft tree|the tree\b", "Guesses of the next few tokens, branching where the matrix holds "
         "several candidates; the model checks every branch at once."),
    Term("depth", r"\bdepth\b", "How many tokens ahead of the answer a guess in the tree sits."),
    Term("verification", r"verif(?:y|ies|ied|ication)\b", "One forward over the whole draft tree, each guess seeing "
         "only the tokens above it, that says which guesses the model itself would have written."),
    Term("accepted path", r"accepted path|accepted (?:drafts?|tokens?)", "The longest branch of the tree whose every "
         "guess matches the model's own choice: those tokens are kept."),
    Term("bonus token", r"bonus(?: token)?", "The token the model predicts after the accepted path, in the same "
         "forward: every step gains at least this one token."),
    Term("tokens per step", r"tokens per step", "Accepted guesses plus the bonus token, per forward: plain decoding "
         "gets exactly 1."),
    Term("t(N)/t(1)", r"t\(N\)/t\(1\)", "What a step checking N tokens costs against a plain decoding step (one "
         "token), timed on this machine."),
    Term("learned beforehand", r"(?:sample answers?|answers to (?:the project's )?sample questions)(?: learned "
         r"beforehand)?|learned beforehand", "The model's own answers to the project's sample questions, decoded "
         "before any visitor: the matrix starts from them and the hybrid copies runs of them."),
    Term("hybrid (matrix + context)", r"hybrid|matrix \+ context", "The paper's matrix tree plus runs of tokens "
         "copied from earlier in the conversation where they continue what was just written."),
    Term("context-free guess", r"context-free|guess after the token alone", "A row filled from one forward of the "
         "token alone, before any answer used it: the model's guess with no context."),
    Term("exact mode", r"exact mode", "Products and attention that round every row as a one-token forward would, so "
         "Token Recycling's answer equals plain decoding's bit for bit."),
    Term("near tie", r"near tie", "Two tokens the model scored almost alike, where rounding alone can pick the "
         "other one."),
    Term("short turns", r"short turns?|pairs of (?:short )?turns", "The meter times Token Recycling and plain "
         "decoding taking turns, a short stretch of the same tokens each, so a change of load hits both alike."),
    Term("tok/s", r"tok/s", "Tokens per second, measured on the machine serving this page while it also draws the "
         "page: a benchmark of the engine alone (the README's table) runs faster, so compare ratios, not tok/s."),
    Term("standard error", r"standard error", "How far the measured speedup would likely move if measured again: "
         "the ± after it."),
)
_MATCHER = re.compile("|".join(f"(?P<t{i}>{t.pattern})" for i, t in enumerate(TERMS)), re.IGNORECASE)
_QUOTED = re.compile(r"'[^'\s]*'")  # a token as the page quotes it ('␣forward'): never glossed


def gloss(text: str) -> str:
    """Plain text as escaped HTML, the first use of each glossary term marked with its sentence (shown on hover, or
    on tap: the mark takes focus). Quoted tokens are left alone: they are the model's words, not the method's."""
    quoted = [m.span() for m in _QUOTED.finditer(text)]
    out, done, at = [], set(), 0
    for m in _MATCHER.finditer(text):
        term = int(m.lastgroup[1:])
        if term in done or any(a <= m.start() < b for a, b in quoted):
            continue
        done.add(term)
        out.append(html.escape(text[at:m.start()]) + mark(m.group(0), TERMS[term]))
        at = m.end()
    return "".join(out) + html.escape(text[at:])


def mark(words: str, term: Term) -> str:
    """`words` as a glossary mark: dotted underline, the sentence on hover or focus (assets/studio.css)."""
    return (f'<span class="tr-term" tabindex="0" data-tip="{html.escape(term.sentence)}">'
            f"{html.escape(words)}</span>")


def glossary_html() -> str:
    """Every term and its sentence, for the Glossary panel."""
    rows = "".join(f"<dt>{html.escape(t.name)}</dt><dd>{html.escape(t.sentence)}</dd>" for t in TERMS)
    return f'<dl class="tr-glossary">{rows}</dl>'
