"""The warm start's file: safetensors (tensors only, nothing unpickled) with a JSON manifest in its metadata; a file
for another model, or malformed, is refused with the reason (`WarmStartError`) before anything changes."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .engine_state import DRAFTERS

FORMAT = "token-recycling-warm-start/1"
MAX_FILE_BYTES = 16 << 20  # a warm start of a 256k vocabulary with k = 8 is about 11 MB
MAX_LIBRARY_TOKENS = 1 << 19  # answer tokens a file may hold (the shipped file: about 30,000)
_SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rope_theta",
                 "tie_word_embeddings", "head_dim")


class WarmStartError(ValueError):
    """A warm-start file that cannot be used here; the message says why."""


@dataclass
class WarmState:
    """A warm start in memory: the matrix's written rows, the drafters' learned state, the manifest."""

    rows: torch.Tensor  # [R] long, the written rows (ascending)
    table: torch.Tensor  # [R, k] int32, their candidate ids
    probs: torch.Tensor  # [R, k] uint8, their stored probabilities (1/255 steps)
    learned: dict[str, dict]  # per drafter ("adaptive", "hybrid"): AdaptiveDrafter.learned()
    manifest: dict[str, Any]  # plain data: what was learned, from what, for which model
    library: list[list[int]] | None = None  # the answers' token ids, for the hybrid to copy from (None: none kept)


def model_fingerprint(engine) -> str:
    """sha256 of what makes a matrix fit a model: the tokenizer's vocabulary, the network's shape fields, k."""
    config = engine.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    shape = {name: getattr(config, name, None) for name in _SHAPE_FIELDS}
    vocab = sorted(engine.tokenizer.get_vocab().items(), key=lambda item: item[1])
    text = json.dumps({"vocab": vocab, "shape": shape, "rows": engine.vocab_size, "k": engine.matrix.k},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save(state: WarmState, path: str | Path) -> None:
    """Write a warm start as safetensors with its manifest in the metadata (atomically)."""
    from safetensors.torch import save_file

    tensors = {"matrix.rows": state.rows.to(torch.int32), "matrix.table": state.table.contiguous(),
               "matrix.probs": state.probs.contiguous()}
    for name in DRAFTERS:
        tensors[f"{name}.hits"] = state.learned[name]["hits"].double().contiguous()
        tensors[f"{name}.trials"] = state.learned[name]["trials"].double().contiguous()
    if state.library:  # the answers end to end, and each one's length
        tensors["library.tokens"] = torch.tensor([t for a in state.library for t in a], dtype=torch.int32)
        tensors["library.lengths"] = torch.tensor([len(a) for a in state.library], dtype=torch.int32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"manifest": json.dumps(state.manifest, sort_keys=True)})
    tmp.replace(path)


def read(path: str | Path, engine) -> WarmState:
    """A warm-start file for `engine`'s model; WarmStartError, with the reason, when it does not fit."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise WarmStartError(f"warm-start file not found: {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise WarmStartError(f"{path} is {path.stat().st_size:,} bytes, more than a warm start can be")
    try:
        with safe_open(str(path), framework="pt") as f:
            manifest = json.loads((f.metadata() or {}).get("manifest", "null"))
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise WarmStartError(f"{path} is not a warm-start file ({type(exc).__name__})") from exc
    check_manifest(manifest, engine, path)
    library = check_library(tensors, engine.vocab_size, path)
    state = WarmState(*check_tensors(tensors, engine, path), manifest=manifest, library=library)
    for name in DRAFTERS:
        state.learned[name]["trust"] = manifest["trust"][name]
    return state


def check_manifest(manifest: Any, engine, path: Path) -> None:
    """Refuse a manifest of another format or model."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise WarmStartError(f"{path} is not a warm-start file (format {FORMAT!r} expected)")
    if manifest.get("vocab_size") != engine.vocab_size or manifest.get("k") != engine.matrix.k:
        raise WarmStartError(f"{path} was learned for vocabulary {manifest.get('vocab_size')} with k = "
                             f"{manifest.get('k')}, but this model has vocabulary {engine.vocab_size} with k = "
                             f"{engine.matrix.k}")
    if manifest.get("fingerprint") != model_fingerprint(engine):
        raise WarmStartError(f"{path} was learned for another model (its tokenizer or network shape differ from "
                             f"this one's: fingerprint {str(manifest.get('fingerprint'))[:12]}...)")
    counts = {"rows_context_free": 0, **manifest}  # files from before context-free rows have none
    for name in ("answers", "tokens", "rows_filled", "rows_context_free"):
        if not isinstance(counts.get(name), int) or counts[name] < 0:
            raise WarmStartError(f"{path}: manifest field {name} must be an integer >= 0")
    if not isinstance(manifest.get("partial", False), bool) or not isinstance(manifest.get("corpus_answers", 0), int):
        raise WarmStartError(f"{path}: manifest field partial must be true or false, corpus_answers an integer")
    if counts["rows_context_free"] > manifest["rows_filled"]:
        raise WarmStartError(f"{path}: manifest counts more context-free rows than rows")
    trust = manifest.get("trust")
    if not isinstance(trust, dict) or set(trust) != set(DRAFTERS):
        raise WarmStartError(f"{path}: manifest field trust must hold {', '.join(DRAFTERS)}")


def check_library(tensors: dict[str, torch.Tensor], vocab: int, path: Path) -> list[list[int]] | None:
    """The answers of library.tokens / library.lengths (popped from `tensors`; None without them), all checked."""
    if "library.tokens" not in tensors and "library.lengths" not in tensors:
        return None
    tokens, lengths = tensors.pop("library.tokens", None), tensors.pop("library.lengths", None)
    if tokens is None or lengths is None or tokens.dtype != torch.int32 or lengths.dtype != torch.int32 \
            or tokens.dim() != 1 or lengths.dim() != 1:
        raise WarmStartError(f"{path}: library.tokens and library.lengths must both be int32 vectors")
    if tokens.numel() > MAX_LIBRARY_TOKENS or (lengths.numel() and int(lengths.min()) < 1) \
            or int(lengths.sum()) != tokens.numel():
        raise WarmStartError(f"{path}: the library's lengths must be >= 1 and add up to its tokens (at most "
                             f"{MAX_LIBRARY_TOKENS:,})")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise WarmStartError(f"{path}: library token ids outside the vocabulary [0, {vocab})")
    return [answer.tolist() for answer in torch.split(tokens, lengths.tolist())]


def check_tensors(tensors: dict[str, torch.Tensor], engine,
                  path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, dict]]:
    """(rows, table, probs, learned counts) of a file's tensors, every shape, type and id checked."""
    names = {"matrix.rows", "matrix.table", "matrix.probs", *(f"{d}.{c}" for d in DRAFTERS for c in ("hits", "trials"))}
    if set(tensors) != names:
        raise WarmStartError(f"{path}: tensors {sorted(names)} expected, found {sorted(tensors)}")
    rows, table, probs = tensors["matrix.rows"], tensors["matrix.table"], tensors["matrix.probs"]
    vocab, k = engine.vocab_size, engine.matrix.k
    if rows.dtype != torch.int32 or table.dtype != torch.int32 or probs.dtype != torch.uint8:
        raise WarmStartError(f"{path}: rows and candidate ids must be int32, probabilities uint8")
    if rows.dim() != 1 or table.shape != (rows.numel(), k) or probs.shape != (rows.numel(), k):
        raise WarmStartError(f"{path}: the matrix tensors' shapes do not agree (rows [R], candidates [R, {k}])")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= vocab or int(table.min()) < 0
                         or int(table.max()) >= vocab or rows.unique().numel() != rows.numel()):
        raise WarmStartError(f"{path}: row or candidate ids outside the vocabulary [0, {vocab}), or repeated rows")
    learned = {d: {"hits": tensors[f"{d}.hits"], "trials": tensors[f"{d}.trials"]} for d in DRAFTERS}
    if any(t.dtype != torch.float64 or t.dim() != 1 or not bool(torch.isfinite(t).all())
           for counts in learned.values() for t in counts.values()):
        raise WarmStartError(f"{path}: calibration counts must be finite float64 vectors")
    return rows.long(), table, probs, learned
