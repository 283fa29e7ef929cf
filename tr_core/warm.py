"""A warm start: the matrix rows, drafter calibration and trust, and answers a fresh engine drafts from in its first
answer, learned beforehand on the project's own corpus, never a visitor's text (docs/warm-start.md).
Here: `warm_start` and applying one; warm_build.py learns one, warm_file.py reads and writes its file."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# re-exported: `tr_core.warm` is the one door to the warm start
from .warm_build import (CALIBRATE_EVERY, COUNT_CAP, Pace, average_rows, context_free_rows,  # noqa: F401
                         decode_answers, learn, set_rows, with_library)
from .warm_file import FORMAT, WarmStartError, WarmState, model_fingerprint, read, save  # noqa: F401

ASSETS = Path(__file__).resolve().parent / "warm_start"  # package data: shipped with the wheel too
CORPUS = ASSETS / "corpus.jsonl"
SHIPPED = ASSETS / "smollm2-135m-instruct.safetensors"  # the embedded model's warm start
EMBEDDED_NAMES = ("", "embedded", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
LEARN_PROMPTS = 48  # another model learns from this many corpus prompts (spread over its categories) ...
LEARN_TOKENS = 64  # ... of at most this many tokens each: about a minute for a 135M model on 2 CPU cores
# a first answer waits at most about this long for its model's warm start (a partial one if time runs out)
FIRST_ANSWER_BUDGET_S = 45.0


@dataclass(frozen=True)
class WarmStartInfo:
    """What a `warm_start` call did, as plain data for the page, the command line and the benchmark."""

    source: str  # "shipped", "cached" (learned earlier), "learned" (just now), "file" (a path given) or "none"
    answers: int  # corpus answers the warm start was learned from (0: none)
    tokens: int  # tokens those answers decoded
    rows_filled: int  # adjacency-matrix rows it fills
    path: str  # the file it came from or was saved to ("" for none)
    note: str = ""  # why the engine starts cold ("none"), or why a learned one was not cached
    context_free: int = 0  # of those rows, how many hold the model's context-free guess (no answer used the token)
    library: int = 0  # of those answers, how many the hybrid tree can copy runs from (0: a file without them)
    partial: bool = False  # learned within a time budget that ran out: from `answers` of `of` corpus answers
    of: int = 0  # the corpus answers it was to be learned from (0: not recorded)
    seconds: float = 0.0  # how long learning it took (0: not recorded)

    def describe(self) -> str:
        """One plain-English line for the page (its words, not the jargon "warm start")."""
        if self.source not in ("shipped", "cached", "file", "learned"):
            return f"Cold start: the matrix starts empty{f' ({self.note})' if self.note else ''}"
        learned = (f"from {self.answers} of {self.of} generated answers in {self.seconds:.0f} s, learned in part "
                   if self.partial else f"on {self.answers} generated answers ")
        learned += f"({self.rows_filled - self.context_free:,} rows"
        learned += (f"; {self.context_free:,} more rows hold the model's guess after the token alone)"
                    if self.context_free else ")")
        copies = "; the matrix + context (hybrid) tree also copies runs from those answers" if self.library else ""
        return {"shipped": f"Learned beforehand: the matrix was pre-learned {learned} shipped with the app{copies}",
                "cached": f"Learned beforehand: learned once for this model {learned}, kept in {self.path}{copies}",
                "file": f"Learned beforehand: from {self.path}, learned {learned}{copies}",
                "learned": f"Learned beforehand: learned just now for this model {learned}, kept in {self.path} for "
                           f"next time{copies}"}[self.source]

def is_embedded(model_name: str | None) -> bool:
    """Whether a model name means the embedded SmolLM2-135M-Instruct (the model whose warm start is shipped)."""
    return model_name is None or str(model_name).strip() in EMBEDDED_NAMES


def read_corpus(path: str | Path = CORPUS) -> list[str]:
    """The corpus's prompts, in file order: JSON lines {"category", "prompt"}; raises WarmStartError if malformed."""
    prompts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WarmStartError(f"{path}:{number}: not a JSON object with a prompt") from exc
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > 4000:
            raise WarmStartError(f"{path}:{number}: a prompt is a non-empty string of at most 4000 characters")
        prompts.append(prompt)
    if not prompts:
        raise WarmStartError(f"{path}: no prompts")
    return prompts


def spread(prompts: list[str], n: int) -> list[str]:
    """n prompts taken evenly over the list (the corpus is grouped by category: each gets its share)."""
    if n >= len(prompts):
        return list(prompts)
    return [prompts[i * len(prompts) // n] for i in range(n)]


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def apply(engine, state: WarmState) -> None:
    """Replace what the engine learned by the warm state; one that does not fit changes nothing (WarmStartError)."""
    library = shared_library(tuple(map(tuple, state.library))) if state.library else None
    try:
        engine.adopt_warm(state.learned, library)
    except ValueError as exc:
        raise WarmStartError(str(exc)) from exc
    set_rows(engine.matrix, state.rows, state.table, state.probs)


@functools.lru_cache(maxsize=4)
def shared_library(answers: tuple[tuple[int, ...], ...]):
    """The hybrid's library of these answers, built once and shared by every engine (a library never changes)."""
    from .context import Library

    return Library([list(a) for a in answers])


def fresh_session(engine) -> None:
    """The engine as a new session finds it (`Engine.start_session`): cold, its measured forward costs kept."""
    engine.start_session()


def cached_path(model_name: str, fingerprint: str) -> Path:
    """Where another model's learned warm start is kept: the cache folder's warm-start/ (beside converted models)."""
    from .models import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(model_name)).name or "model").strip("-.")[:60] or "model"
    return cache_dir() / "warm-start" / f"{slug}-{fingerprint[:16]}.safetensors"


def warm_start(engine, model_name: str | None, *, learn: bool = True,
               progress: Callable[[int, int], None] | None = None, budget_s: float | None = None,
               between: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.monotonic) -> WarmStartInfo:
    """Start `engine` warm from the shipped file, the cached one or (`learn`) one learned now within `budget_s`
    (a partial one, which only a call without a budget replaces); returns what was done, as `engine.warm`."""
    if is_embedded(model_name) and SHIPPED.is_file():
        return _applied(engine, read(SHIPPED, engine), "shipped", SHIPPED)
    path = cached_path(model_name or "embedded", model_fingerprint(engine))
    if path.is_file():
        try:
            state = read(path, engine)
            if not (learn and budget_s is None and state.manifest.get("partial")):
                return _applied(engine, state, "cached", path)
        except (WarmStartError, ValueError):
            pass  # a stale or damaged cache file: learned again below when allowed
    if not learn or not CORPUS.is_file():
        note = "no warm start learned for this model yet" if learn is False else f"the corpus {CORPUS} is missing"
        engine.warm = WarmStartInfo("none", 0, 0, 0, "", note=note)
        return engine.warm
    return _learn_and_cache(engine, path, progress, Pace(budget_s, clock, between))


def warm_from_file(engine, path: str | Path) -> WarmStartInfo:
    """Apply the warm-start file `path` (WarmStartError when it does not fit this model)."""
    return _applied(engine, read(path, engine), "file", Path(path))


def _learn_and_cache(engine, path: Path, progress: Callable[[int, int], None] | None, pace: Pace) -> WarmStartInfo:
    """Learn from LEARN_PROMPTS corpus prompts spread over its categories (within `pace`); cache and apply it."""
    prompts = read_corpus(CORPUS)
    state = learn(engine, spread(prompts, LEARN_PROMPTS), LEARN_TOKENS, progress, pace=pace)
    state.manifest.update(corpus_sha256=file_sha256(CORPUS), corpus_prompts=len(prompts))
    try:
        save(state, path)
    except OSError as exc:  # a read-only cache still gets this session warm
        return _applied(engine, state, "learned", "", note=f"not cached: {exc}")
    return _applied(engine, state, "learned", path)


def _applied(engine, state: WarmState, source: str, path: str | Path, note: str = "") -> WarmStartInfo:
    """Apply `state`; what it holds as the engine's WarmStartInfo."""
    apply(engine, state)
    m = state.manifest
    engine.warm = WarmStartInfo(source, m["answers"], m["tokens"], m["rows_filled"], str(path), note=note,
                                context_free=int(m.get("rows_context_free", 0)), library=len(state.library or []),
                                partial=bool(m.get("partial", False)), of=int(m.get("corpus_answers", 0) or 0),
                                seconds=float(m.get("learn_s", 0.0) or 0.0))
    return engine.warm


_BACKGROUND: dict[str, threading.Thread] = {}  # model name -> the thread learning its full warm start
_BACKGROUND_LOCK = threading.Lock()


def learn_in_background(make_engine: Callable[[], object], model_name: str, *,
                        hold: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                        between: Callable[[], None] | None = None) -> threading.Thread | None:
    """A daemon thread caching the full warm start of `model_name` (None when one is at it already)."""
    key = str(model_name)
    with _BACKGROUND_LOCK:
        if key in _BACKGROUND and _BACKGROUND[key].is_alive():
            return None

        def run() -> None:
            try:
                with hold():
                    warm_start(make_engine(), model_name, between=between)
            except Exception as exc:  # noqa: BLE001 - a background job: said on the console, the session goes on
                print(f"could not learn the full warm start of {key}: {type(exc).__name__}: {exc}", file=sys.stderr)

        thread = _BACKGROUND[key] = threading.Thread(target=run, daemon=True, name="tr-warm-start-full")
        thread.start()
    return thread
