"""The models this studio serves: loaded once each, shared by every session (each session has its own matrix).

Loading never holds a lock that other sessions wait on: a name being loaded has its own pending slot, so
a chat on an already-loaded model goes on while another model loads (or fails to, slowly, offline).
In public mode only the operator's list can be loaded, and every refused name gets the same short answer.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from .config import EMBEDDED, EMBEDDED_LABEL, StudioConfig

REFUSED = "That model is not offered here: choose one from the list."


class ModelRefused(ValueError):
    """A visitor asked for a model this instance does not offer (public mode)."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


def canonical(name: str | None) -> str:
    """The catalogue key of a model name ('' and the embedded label mean the embedded model)."""
    name = (name or "").strip()
    return EMBEDDED if name in ("", EMBEDDED, EMBEDDED_LABEL) else name


def label(name: str) -> str:
    """A model's name as shown on the page."""
    return EMBEDDED_LABEL if name == EMBEDDED else name


def _default_loader(name: str) -> tuple[Any, Any]:
    from tr_core.models import load_model

    from .zerogpu import on_zerogpu

    # ZeroGPU: the app's copy stays on the CPU; each GPU call moves its worker's copy (studio/zerogpu.py)
    return load_model(None if name == EMBEDDED else name, device="cpu" if on_zerogpu() else None)


class ModelCatalog:
    """(model, tokenizer) per name, each loaded at most once; public mode refuses names off the list."""

    def __init__(self, config: StudioConfig, loader: Callable[[str], tuple[Any, Any]] | None = None,
                 keep: int = 2) -> None:
        self.config = config
        self._loader = loader or _default_loader
        self._keep = keep  # private mode: most models kept in memory (public mode keeps the listed ones)
        self._loaded: dict[str, Future] = {}
        self._lock = threading.Lock()  # guards the dict only, never held while loading

    def allowed(self, name: str | None) -> str:
        """The catalogue key for a visitor's name; raises ModelRefused in public mode for names off the list."""
        key = canonical(name)
        if self.config.public and key not in self.config.models:
            raise ModelRefused()
        return key

    def is_loaded(self, name: str) -> bool:
        """True when the model is in memory and ready."""
        fut = self._loaded.get(canonical(name))
        return fut is not None and fut.done() and fut.exception() is None

    def get(self, name: str | None) -> tuple[Any, Any]:
        """(model, tokenizer), loading on first use; concurrent callers for one name share one load."""
        key = self.allowed(name)
        with self._lock:
            fut = self._loaded.get(key)
            owner = fut is None
            if owner:
                fut = self._loaded[key] = Future()
                self._evict(keep_key=key)
        if owner:
            try:
                fut.set_result(self._loader(key))
            except BaseException as exc:  # noqa: BLE001 - handed to every waiter, then forgotten
                fut.set_exception(exc)
                with self._lock:
                    self._loaded.pop(key, None)
        return fut.result()

    def _evict(self, keep_key: str) -> None:
        """Private mode: drop the oldest loaded models beyond `keep` (never the default, never one loading)."""
        if self.config.public:
            return
        done = [k for k, f in self._loaded.items() if f.done() and k not in (keep_key, self.config.default_model)]
        while len(self._loaded) > self._keep and done:
            self._loaded.pop(done.pop(0), None)
