"""The studio's operator settings: one frozen dataclass, one comment per field."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

EMBEDDED = "embedded"  # the model name of the embedded SmolLM2-135M-Instruct
EMBEDDED_LABEL = "embedded (SmolLM2-135M-Instruct)"
PUBLIC_TIME_LIMIT_S = 120.0  # default per-answer limit on public instances
PUBLIC_MAX_DELAY_S = 0.5  # slow motion cap on public instances (seconds per step)


@dataclass(frozen=True)
class StudioConfig:
    """How this instance of the studio serves its visitors."""

    public: bool = False  # public mode: visitors pick from `models`, never a path; limits apply
    models: tuple[str, ...] = (EMBEDDED,)  # the models offered (the first is the default); EMBEDDED = the embedded one
    time_limit_s: float | None = None  # per-answer wall-clock limit (None = none); public default 120 s
    max_delay_s: float = 3.0  # slow motion: the longest pause per step a visitor may ask for
    max_new_tokens: int = 1024  # the longest answer a visitor may ask for
    max_message_chars: int = 8000  # longest accepted chat message
    max_turns: int = 40  # conversation turns kept (older ones are dropped with a note)
    measure_max_s: float = 30.0  # the speed measurement after an answer stops after this long
    measure_chunk_ms: float = 250.0  # engine time of each Token Recycling chunk in the interleaved measurement
    max_upload_mb: float = 10.0  # largest uploaded file (trace or matrix)

    @property
    def default_model(self) -> str:
        """The model a new session starts with."""
        return self.models[0]


def is_loopback(host: str) -> bool:
    """True when `host` only serves this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wants_public(flag: bool, share: bool, host: str) -> bool:
    """Public mode: asked for, or implied by --share, a non-loopback host, or running on Spaces (SPACE_ID)."""
    return flag or share or not is_loopback(host) or bool(os.environ.get("SPACE_ID"))


def parse_models(text: str | None, default: str | None) -> tuple[str, ...]:
    """The operator's model list: `--models a,b` (first = default); else the default model alone."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        names = [default or EMBEDDED]
    elif default and default not in names:
        names.insert(0, default)
    return tuple(dict.fromkeys(EMBEDDED if n in (EMBEDDED_LABEL, "") else n for n in names))


def make_config(public: bool, models: tuple[str, ...], time_limit_s: float | None, max_delay_s: float | None) -> StudioConfig:
    """Settings with the public-mode defaults filled in where the operator gave none."""
    if time_limit_s is None and public:
        time_limit_s = PUBLIC_TIME_LIMIT_S
    if time_limit_s is not None and time_limit_s <= 0:
        time_limit_s = None
    if max_delay_s is None:
        max_delay_s = PUBLIC_MAX_DELAY_S if public else 3.0
    return StudioConfig(public=public, models=models, time_limit_s=time_limit_s, max_delay_s=max(0.0, min(max_delay_s, 3.0)))
