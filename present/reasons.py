"""What the engine records as data, in words: why a step drafted nothing (StepEvent.no_draft) and where a copied
draft token was found (StepEvent.origins)."""
from __future__ import annotations

from typing import Any, Callable

from tr_core.events import StepEvent


def no_draft_reason(ev: StepEvent, token_text: Callable[[int], str] | None = None) -> str | None:
    """The plain-English reason a step drafted nothing ('no draft: ...'), or None when it gave none (it drafted, its
    drafter always drafts, or an older trace recorded none); `token_text` names the root token."""
    data = ev.no_draft
    if data is None:
        return None
    if data["why"] == "first step":
        return ("no draft: an answer's first step is checked by the prompt's own forward at no extra cost; "
                "a draft would need a forward of its own")
    if data["why"] == "empty row":
        root = repr(token_text(ev.tokens[0])) if token_text is not None else "the last token"
        where = " and the conversation holds no run to copy after it" if data.get("context") else ""
        return f"no draft: the matrix has no candidates after {root} yet (its row was never written){where}"
    size = data.get("drafts", 0)
    return (f"no draft: the best tree ({size} token{'s' * (size != 1)}) would add {data.get('gain', 0.0):.2f} "
            f"accepted tokens on average, which would not pay for its forward ({data.get('cost_ratio', 0.0):.2f}× a "
            f"one-token step on this machine)")


# where a copied run was found (tr_core.context.PLACES), as a phrase
PLACES = {"context": "the context", "prompt": "the prompt", "answer": "this answer", "warm_start": "a sample answer learned beforehand",
          "earlier_prompt": "an earlier prompt", "earlier_answer": "an earlier answer"}


def origin_text(origin: dict[str, Any] | None) -> str:
    """Where a copied token was found, e.g. "copied from the prompt, its 6th token, in a run from its 5th (after a
    3-token match)" (positions as ordinals: "token 83" reads as a vocabulary id); "" for None (not copied)."""
    if origin is None:
        return ""
    first, last = origin["first"] + 1, origin["last"] + 1
    span = f"its {ordinal(last)} token" + ("" if last == first else f", in a run from its {ordinal(first)}")
    return f"copied from {PLACES.get(origin['where'], 'the context')}, {span} (after a {origin['match']}-token match)"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
