"""A chat request's settings, validated at the edge before anything changes: numbers clamped into their ranges, the
draft tree's template checked, this instance's caps applied; and the conversation trimmed to the model's context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .session import InputError, Studio


LIMITS = dict(max_new_tokens=(1, 1024), temperature=(0.0, 2.0), top_p=(0.05, 1.0), top_k=(0, 1000), seed=(0, 2**31 - 1),
              k=(1, 16), delay=(0.0, 3.0), repetition_penalty=(0.5, 2.0))


@dataclass(frozen=True)
class ChatSettings:
    """A chat request's decoding settings, as validated (see `parse_settings`)."""

    max_new_tokens: int = 128  # longest answer
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus threshold
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; applied to every tree node with its own prefix
    seed: int = 0  # sampling seed
    template: str = ""  # draft tree template ("" = the studio's default)
    k: int = 8  # candidates per matrix row
    compare: bool = True  # measure the speedup against plain decoding after the answer
    delay: float = 0.0  # slow motion: pause per step (s)
    colour: bool = True  # colour each step's accepted run in the chat


def clamp(name: str, value: Any, notes: list[str], cast=float) -> Any:
    """Clamp a setting into its range (noting it), treating empty or unreadable input as the range's low end."""
    lo, hi = LIMITS[name]
    try:
        v = float(value)
        if v != v:  # NaN
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        notes.append(f"{name} {str(value)[:20]!r} is not a number; using {lo}.")
        return cast(lo)
    if v < lo or v > hi:
        notes.append(f"{name} = {str(value)[:20]} is outside [{lo}, {hi}]; clamped.")
    return cast(min(max(v, lo), hi))


def parse_settings(studio: Studio, raw: dict[str, Any], notes: list[str]) -> ChatSettings:
    """Validate the page's (or an API caller's) settings: clamp numbers, check the template, apply the caps."""
    from tr_core.tree import TEMPLATE_NAMES

    cfg = studio.config
    template = raw.get("template") or studio.default_template
    if template not in TEMPLATE_NAMES:
        notes.append(f"Unknown template {str(template)[:40]!r}; using {studio.default_template}.")
        template = studio.default_template
    max_new = clamp("max_new_tokens", raw.get("max_new_tokens", 128), notes, int)
    if max_new > cfg.max_new_tokens:
        notes.append(f"Max new tokens capped at {cfg.max_new_tokens} on this instance.")
        max_new = cfg.max_new_tokens
    delay = clamp("delay", raw.get("delay", 0.0), notes)
    if delay > cfg.max_delay_s:
        notes.append(f"Slow motion capped at {cfg.max_delay_s:g} s per step on this instance.")
        delay = cfg.max_delay_s
    top_p = raw.get("top_p", 1.0)
    return ChatSettings(max_new_tokens=max_new, temperature=clamp("temperature", raw.get("temperature", 0.0), notes),
                        top_p=clamp("top_p", top_p, notes) if top_p not in (None, "", 0) else 1.0,
                        top_k=clamp("top_k", raw.get("top_k", 0), notes, int),
                        repetition_penalty=clamp("repetition_penalty", raw.get("repetition_penalty", 1.0), notes),
                        seed=clamp("seed", raw.get("seed", 0), notes, int), template=template,
                        k=clamp("k", raw.get("k", 8), notes, int), compare=bool(raw.get("compare", True)),
                        delay=delay, colour=bool(raw.get("colour", True)))


def trim_to_context(encode, messages: list[dict[str, str]], limit: int, max_new: int) -> tuple[list[int], int, int]:
    """Drop the oldest turns until prompt + answer fit the context; return (ids, turns dropped, max_new)."""
    dropped = 0
    msgs = list(messages)
    ids = encode(msgs)
    while len(ids) + max_new > limit and len(msgs) > 1:
        cut = 2 if len(msgs) > 2 and msgs[0]["role"] == "user" else 1
        msgs = msgs[cut:]
        dropped += cut
        ids = encode(msgs)
    if len(ids) + max_new > limit:
        max_new = limit - len(ids)
        if max_new < 1:
            raise InputError(f"the message alone is {len(ids)} tokens, longer than the model's context ({limit}); "
                             "shorten it")
    return ids, dropped, max_new
