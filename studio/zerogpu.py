"""Hugging Face ZeroGPU: decoding and the speed measurement inside functions decorated with `spaces.GPU`.

On a ZeroGPU Space (SPACES_ZERO_GPU set) the GPU exists only inside a decorated call, and each call runs in a
worker process forked from the app (reused while idle): arguments and results cross as pickles, and whatever
the call changes in its own memory stays there. So the app keeps its models on the CPU and its sessions'
engines on the CPU (for the tokenizer and the matrix); a call gets the model name, the session's matrix as
bytes, the prompt and the settings, builds (or reuses) an engine on the GPU in the worker, yields the plain-data
events, and last the matrix the answer taught, which the session's engine takes back. A visitor's Stop reaches
the worker through a flag file (the call then sums up its answer as usual, so nothing it learned is lost).
Elsewhere nothing here is used, and `spaces` need not be installed.
"""
from __future__ import annotations

import io
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ZEROGPU_ENV = "SPACES_ZERO_GPU"  # set by Hugging Face on ZeroGPU Spaces
MAX_DURATION_ENV = "TR_ZEROGPU_MAX_S"  # the longest GPU call this Space's quota allows (operator setting)
DEFAULT_MAX_S = 120  # the longest `duration` asked for by default: longer asks are refused by small quotas
SETUP_S = 15  # a call's time beyond its decoding: the worker's start, moving the model, the matrix both ways
LABEL = "a ZeroGPU GPU (Hugging Face Spaces, shared)"  # the machine named beside speeds timed in GPU calls
TOKEN_S = 0.1  # seconds a token may take in a GPU call (10 tokens/s: plain decoding of a large model on a slow GPU)
MIN_DECODE_S = 10.0  # the shortest decoding time asked for (short answers still pay the call's start-up)
DRAIN_S = 10.0  # after a Stop, how long the worker may take to finish its step and send the matrix back

# The module's state, mutated in place, never rebound (each forked worker inherits it as the app left it):
_INSTALLED: dict[str, Any] = {}  # "catalog": the app's ModelCatalog, the workers' source of models
_ENGINES: dict[tuple[str, int], Any] = {}  # the worker's GPU engines by (model, k): built once per worker process
_CALLS: dict[str, Callable[..., Iterator[Any]]] = {}  # "decode" / "measure": the decorated functions


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space (SPACES_ZERO_GPU set to a true value)."""
    return os.environ.get(ZEROGPU_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def max_duration() -> int:
    """The longest GPU call to ask for, in seconds ($TR_ZEROGPU_MAX_S, else 120)."""
    try:
        return max(SETUP_S + 5, int(float(os.environ.get(MAX_DURATION_ENV, DEFAULT_MAX_S))))
    except ValueError:
        return DEFAULT_MAX_S


def answer_budget(time_limit_s: float | None, max_new_tokens: int | None = None) -> tuple[float, int]:
    """(seconds of decoding, GPU duration to ask for) for one answer: what its tokens need at TOKEN_S each, within
    the time limit, cut to fit the longest call (a shorter ask waits less for ZeroGPU's quota)."""
    longest = max_duration()
    needed = float("inf") if max_new_tokens is None else max(MIN_DECODE_S, max_new_tokens * TOKEN_S)
    decode_s = min(time_limit_s or float("inf"), float(longest - SETUP_S), needed)
    return decode_s, int(math.ceil(min(longest, decode_s + SETUP_S)))


def measure_duration(measure_max_s: float) -> int:
    """The GPU duration to ask for one speed measurement (capped at `measure_max_s` of decoding)."""
    return int(min(max_duration(), measure_max_s + SETUP_S))


def import_spaces() -> None:
    """On ZeroGPU: import `spaces` (before torch, which it patches so that the app never initialises CUDA)."""
    if on_zerogpu():
        import spaces  # type: ignore  # noqa: F401  # the Space's requirements provide it


def install(catalog: Any) -> bool:
    """On ZeroGPU: decorate the GPU functions with `spaces.GPU` (at start-up, as ZeroGPU requires) and keep the
    catalogue the workers load models from. Elsewhere: nothing (and False)."""
    if not on_zerogpu():
        return False
    import spaces  # type: ignore  # only on ZeroGPU; the Space's requirements provide it

    _INSTALLED["catalog"] = catalog
    _CALLS["decode"] = spaces.GPU(duration=_requested)(gpu_decode)
    _CALLS["measure"] = spaces.GPU(duration=_requested)(gpu_measure)
    return True


def installed() -> bool:
    """True once `install` decorated the GPU functions (decoding then goes through them)."""
    return bool(_CALLS)


def _requested(*args: Any, duration: int, **kwargs: Any) -> int:
    """`spaces.GPU`'s duration for a call: each call names its own (see answer_budget, measure_duration)."""
    return duration


# ------------------------------------------------------------------------ the matrix across the process boundary


def pack_state(engine: Any) -> bytes:
    """What answers teach an engine (`Engine.state_dict`: the matrix and its clock, the drafters' calibration, trust
    and measured forward costs, as CPU tensors: a CUDA tensor must not cross ZeroGPU's boundary), as bytes. Not the
    hybrid tree's context index: a call starts it from its own prompt."""
    import torch

    buf = io.BytesIO()
    torch.save(engine.state_dict(), buf)
    return buf.getvalue()


def unpack_state(engine: Any, data: bytes, costs: bool) -> None:
    """Take packed state into `engine` (its matrix in place, on its own device); `costs`: also the forward costs."""
    import torch

    engine.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu", weights_only=False), costs=costs)


# ----------------------------------------------------------------------------- inside the GPU worker process


def worker_engine(model_name: str, k: int, state: bytes) -> Any:
    """The worker's engine for (model, k) on the GPU, holding the session's matrix; forgets the previous caller's
    matrix and context index first (sessions never share what they learned), keeps its measured costs."""
    import torch

    from tr_core.engine import Engine
    from tr_core.models import default_dtype

    engine = _ENGINES.get((model_name, k))
    if engine is None:
        model, tokenizer = _INSTALLED["catalog"].get(model_name)
        if torch.cuda.is_available() and next(model.parameters()).device.type != "cuda":
            model.to("cuda", default_dtype(torch.device("cuda")))  # this worker's copy; the app's stays on the CPU
        engine = _ENGINES[(model_name, k)] = Engine(model, tokenizer, topk_candidates=k)
    engine.forget()
    unpack_state(engine, state, costs=False)
    return engine


def gpu_decode(model_name: str, k: int, state: bytes, ids: list[int], cfg: Any, decode_s: float, stop_file: str,
               duration: int) -> Iterator[Any]:
    """(decorated with spaces.GPU) One answer's events, then the packed state it taught. Ends at `decode_s`
    seconds or once `stop_file` exists; `duration` is only read by the decorator."""
    engine = worker_engine(model_name, k, state)
    deadline = time.monotonic() + decode_s
    yield from engine.generate(ids, cfg, stop=lambda: time.monotonic() > deadline or os.path.exists(stop_file))
    yield pack_state(engine)


def gpu_measure(model_name: str, k: int, state: bytes, ids: list[int], cfg: Any, max_s: float, chunk_ms: float,
                duration: int, sizes: list[int] | None = None) -> Iterator[Any]:
    """(decorated with spaces.GPU) The interleaved speed measurement from the answer's starting state, drafting the
    answer's tree `sizes` again: its SpeedEstimates (meter.interleave); closing the call stops it
    after its current round."""
    from .meter import interleave

    twin = worker_engine(model_name, k, state)

    def runs() -> tuple[Iterator, Iterator]:
        engine = twin.fork(sizes)
        return engine.generate(ids, cfg), engine.generate(ids, cfg.with_(plain=True))

    yield from interleave(*runs(), max_s=max_s, chunk_ms=chunk_ms, again=runs)


# ------------------------------------------------------------------------------------------- in the app


class RemoteEngine:
    """A session's engine whose decoding runs in ZeroGPU's decorated call; everything else is the engine's own.
    No process-wide slot is taken: every visitor's answer is a GPU call of its own, run side by side."""

    def __init__(self, engine: Any, model_name: str, time_limit_s: float | None) -> None:
        self.engine, self.model_name, self.time_limit_s = engine, model_name, time_limit_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[int], cfg: Any, stop: Callable[[], bool] | None = None) -> Iterator[Any]:
        """The answer's events from the GPU call; its learned matrix is taken into the session's engine at the end.
        After `stop()` the events the worker decoded meanwhile are dropped (the answer ends where it was stopped)."""
        decode_s, duration = answer_budget(self.time_limit_s, getattr(cfg, "max_new_tokens", None))
        flag = Path(tempfile.gettempdir()) / f"tr-stop-{os.getpid()}-{id(self)}-{time.monotonic_ns()}"
        call = _CALLS["decode"](self.model_name, self.engine.matrix.k, pack_state(self.engine), list(prompt_ids), cfg,
                                decode_s=decode_s, stop_file=str(flag), duration=duration)
        drain_until = None
        try:
            for item in call:
                if isinstance(item, bytes):
                    unpack_state(self.engine, item, costs=True)
                elif drain_until is None:
                    yield item
                    if stop is not None and stop():
                        flag.touch()  # the worker sums up after its step and still sends the matrix back
                        drain_until = time.monotonic() + DRAIN_S
                elif time.monotonic() > drain_until:
                    break  # the worker did not stop in time: leave it (the session keeps its matrix as it was)
        finally:
            call.close()
            flag.unlink(missing_ok=True)


def measure_rounds(engine: Any, model_name: str, ids: list[int], cfg: Any, max_s: float,
                   chunk_ms: float, sizes: list[int] | None = None) -> Iterator[Any]:
    """The speed measurement's estimates from a GPU call, starting from `engine`'s state (the answer's twin) and
    drafting the answer's tree `sizes` again."""
    return _CALLS["measure"](model_name, engine.matrix.k, pack_state(engine), list(ids), cfg, max_s=max_s,
                             chunk_ms=chunk_ms, duration=measure_duration(max_s), sizes=sizes)
