"""Why a step drafted nothing, in words: the engine records the reason as data (StepEvent.no_draft), this phrases it."""
from __future__ import annotations

from typing import Callable

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
