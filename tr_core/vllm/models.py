"""The model folder vLLM loads: as given, or the embedded model converted once to safetensors (as the library does)."""
from __future__ import annotations


def model_folder(name: str | None = None) -> str:
    """A folder or hub id vLLM can load; None: the embedded SmolLM2-135M-Instruct, converted from GGUF once."""
    from tr_core.models import resolve_source

    source, _ = resolve_source(name)
    return source
