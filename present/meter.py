"""The speedup meter: Token Recycling's speed beside plain decoding's over the same tokens, and their ratio with its
uncertainty (or why there is none), as HTML. Every number comes from engine-side timings (studio/meter.py)."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from .glossary import gloss


@dataclass
class MeterView:
    """What the speedup meter shows; every number comes from engine-side timings (UI time excluded)."""

    # idle | live (answering; measured after it) | live-off (answering; not to be measured) | measuring | measured |
    # noisy | off (not compared)
    state: str = "idle"
    tr_tps: float | None = None  # Token Recycling tokens/s
    plain_tps: float | None = None  # plain decoding tokens/s over the same tokens (measured, never estimated)
    mean_accepted: float | None = None  # tokens per step, bonus included
    ratio: float | None = None  # plain time / Token Recycling time (states measured and noisy)
    error: float | None = None  # one standard error of the ratio
    identical: bool | None = None  # both outputs token-identical (None = not compared)
    exact: bool | None = None  # Token Recycling ran in exact mode (row-invariant products)
    parted: dict | None = None  # where the outputs parted (trace_schema PARTED), when they did
    note: str = ""  # one line under the figures: where the numbers come from, or why there is no ratio
    machine: str | None = None  # the machine the speeds were timed on ("": not recorded; None: no figures yet)
    method: str = "Token Recycling"  # what drafted (method_name): the figures are that drafting's, not another's
    model: str = ""  # the model the figures are of ("": not recorded)


PARITY = 0.05  # ratios within 5% of 1 (or whose error bar crosses 1) are shown as parity, not as a speedup


def ratio_class(ratio: float, error: float = 0.0) -> str:
    """The meter's colour by meaning: 'up' (speedup), 'par' (no clear difference) or 'down' (slowdown)."""
    if ratio - error > 1.0 and ratio >= 1.0 + PARITY:
        return "up"
    if ratio + error < 1.0 and ratio <= 1.0 - PARITY:
        return "down"
    return "par"


def _ratio_parts(v: MeterView) -> tuple[str, str, str]:
    """(ratio text, its colour class, its label) for the meter's big line."""
    if v.state == "measured" and v.ratio is not None:
        err = f" ± {v.error:.2f}" if v.error is not None else ""
        cls = ratio_class(v.ratio, v.error or 0.0)
        verb = {"up": "measured", "down": "measured: slower", "par": "measured: no clear difference"}[cls]
        # "1.30× as fast as plain decoding", not "1.30× faster" (read as 130% faster); one line in the presentation view
        return f"{v.ratio:.2f}×{err}", cls, f"as fast as plain decoding ({verb})"
    if v.state == "noisy":
        return "too noisy to measure", "none", "speedup not shown"
    if v.state in ("live", "measuring"):
        return "…", "none", "speedup: measured right after the answer" if v.state == "live" else "measuring speedup…"
    if v.state == "live-off":
        return "—", "none", "speedup: not measured (turned off in the decoding settings)"
    if v.state == "off":
        return "—", "none", "speedup not measured"
    return "—", "none", "speedup"


def speed_format(v: MeterView, plain: float | None) -> str:
    """The format of both tok/s figures: one decimal, or as many more (up to 3) as it takes for the shown speeds to
    divide to the shown ratio (31.43 / 21.30 = 1.4756 shows 1.48×, but 31.4 / 21.3 = 1.474 would read 1.47×)."""
    if v.state != "measured" or v.ratio is None or not v.tr_tps or not plain:
        return "{:.1f}"
    shown = round(v.ratio, 2)
    for decimals in (1, 2, 3):
        if round(round(v.tr_tps, decimals) / round(plain, decimals), 2) == shown:
            return f"{{:.{decimals}f}}"
    return "{:.1f}"


FIXES = {"exact_mode": "exact mode (row-invariant products) would keep them together",
         "float32": "float32 would keep them together",
         "unknown": "exact mode was on, so this should not happen: please report it"}
NEAR_TIE = 0.1  # a gap between the two best scores below this reads as a near tie


# the one wording of the outcome (meter, replay, side by side)
IDENTICAL, DIFFERS, ROUNDING = ("✓ token-identical to plain decoding", "✗ differs from plain decoding",
                                "≈ identical up to rounding")
ROUNDING_WHY = ("A tree forward rounds a little differently from a one-token forward; at a near tie the best token "
                "can flip")


def identity_words(identical: bool | None, exact: bool | None) -> str:
    """Whether Token Recycling gave plain decoding's tokens, in words: ✓; ✗ in exact mode (a promise broken);
    outside it ≈ (rounding may part them); "" when not compared."""
    if identical is None:
        return ""
    return IDENTICAL if identical else DIFFERS if exact else ROUNDING


def identity_flag(v: MeterView) -> str:
    """identity_words as the meter's flag, with where the outputs parted and why."""
    words = identity_words(v.identical, v.exact)
    if not words:
        return '<span class="tr-flag tr-flag-none">outputs not compared</span>'
    kind = {IDENTICAL: "ok", DIFFERS: "bad", ROUNDING: "near"}[words]
    title = f' title="{ROUNDING_WHY}"' if words == ROUNDING else ""
    flag = f'<span class="tr-flag tr-flag-{kind}"{title}>{words}</span>'
    return flag + (f'<div class="tr-parted">{html.escape(parting_text(v.parted))}</div>' if v.parted else "")


def parting_text(p: dict) -> str:
    """One line: where the outputs parted, the two tokens, how far apart the model scored them, and the fix."""
    line = (f"parted at answer token {p['index'] + 1}: {p.get('first_text', '')!r} (Token Recycling) vs "
            f"{p.get('second_text', '')!r} (plain)")
    if p.get("gap") is not None:
        tie = ", a near tie" if p["gap"] < NEAR_TIE else ""
        line += f", scored {p['gap']:.3g} apart in {p.get('dtype', '')}{tie}"
    fix = FIXES.get(p.get("fix", ""), "")
    return f"{line}; {fix}" if fix else line


METHOD_NAMES = {"adaptive": "Matrix only", "hybrid": "Matrix + context", "2.2.2": "Paper's 80-node tree"}


def method_name(trace: Any) -> str:
    """The drafting a trace's speeds belong to, named as the drafting switch names it (else "Token Recycling")."""
    template = str((trace.settings if trace is not None else {}).get("template") or "")
    return METHOD_NAMES.get(template, "Token Recycling")


def drafting_words(trace: Any) -> str:
    """Which drafting made a trace's answer and whether it is the paper's: "Paper's 80-node tree (the paper's own)",
    "Matrix only (the paper's)" (the matrix alone, in another tree) or "Matrix + context (not in the paper)"; ""
    when the trace does not say."""
    template = str((trace.settings if trace is not None else {}).get("template") or "")
    if template.startswith("hybrid"):
        return f"{METHOD_NAMES['hybrid']} (not in the paper)"
    if template == "2.2.2":
        return f"{METHOD_NAMES['2.2.2']} (the paper's own)"
    return f"{METHOD_NAMES['adaptive']} (the paper's)" if template else ""


def machine_of(trace: Any) -> str:
    """The machine a trace's speeds were timed on ("" for none, or a trace recorded before the studio kept it)."""
    return str((trace.settings if trace is not None else {}).get("machine") or "")


def figures_of(trace: Any) -> dict[str, str]:
    """Whose figures a trace's meter shows: the machine they were timed on, the drafting, the model (MeterView)."""
    return {"machine": machine_of(trace), "method": method_name(trace),
            "model": str(getattr(trace, "model", "") or "")}


def machine_line(machine: str | None, model: str = "") -> str:
    """The model and the machine the meter's speeds were timed on, under its figures ("" before there are any)."""
    if machine is None:
        return ""
    text = f"timed on {machine}" if machine else "the machine these speeds were timed on was not recorded"
    text = f"{model[:60]}, {text}" if model else text
    return f'<div class="tr-machine" id="tr-machine">{html.escape(text)}</div>'


def meter_html(v: MeterView) -> str:
    """The speedup meter as HTML: the ratio with its uncertainty (or why none), both speeds, mean accepted."""
    def num(x: float | None, fmt: str = "{:.1f}") -> str:
        return fmt.format(x) if x is not None else "—"

    ratio_text, cls, label = _ratio_parts(v)
    plain = None if v.state == "noisy" else v.plain_tps  # beside Token Recycling's, it would imply the unshown ratio
    tps = speed_format(v, plain)
    flag = identity_flag(v)
    live = ' <span class="tr-live">live</span>' if v.state == "live" else ""
    note = f'<div class="tr-note" title="{html.escape(v.note)}">{gloss(v.note)}</div>' if v.note else ""
    note = machine_line(v.machine, v.model) + note
    return (
        f'<div class="tr-meter tr-meter-{cls}" id="tr-meter" data-state="{html.escape(v.state)}">'
        f'<div class="tr-big"><span class="tr-ratio tr-ratio-{cls}" id="tr-ratio">{html.escape(ratio_text)}</span>'
        f'<span class="tr-biglabel">{gloss(label)}{live}</span></div>'
        '<div class="tr-cells">'
        f'<div class="tr-cell"><span class="tr-val" id="tr-tps">{num(v.tr_tps, tps)}</span><span class="tr-lab">{html.escape(v.method)} {gloss("tok/s")}</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-plain">{num(plain, tps)}</span><span class="tr-lab">{gloss("plain tok/s, same tokens")}</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-mat">{num(v.mean_accepted, "{:.2f}")}</span><span class="tr-lab">tokens per step</span></div>'
        f'</div>{flag}{note}</div>'
    )
