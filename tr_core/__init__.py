"""Lossless Token Recycling speculative decoding for transformers causal LMs (Luo et al., ACL 2025, arXiv 2408.08696).

The public API is what this file exports, with tr_core.hf.generate and tr_core.warm.warm_start."""
from .config import DecodeConfig
from .engine import Engine, verify_tree
from .events import Event, StepEvent, SummaryEvent, event_from_dict
from .matrix import AdjacencyMatrix
from .models import ModelLoadError, load_model
from .tree import (ADAPTIVE, ADAPTIVE_FIXED, TEMPLATE_NAMES, TEMPLATES, DraftTree, TemplateError, build_tree,
                   resolve_template, validate_template)

__all__ = [
    "ADAPTIVE", "ADAPTIVE_FIXED", "AdjacencyMatrix", "DecodeConfig", "DraftTree", "Engine", "Event", "ModelLoadError",
    "StepEvent", "SummaryEvent", "TEMPLATE_NAMES", "TEMPLATES", "TemplateError", "build_tree", "event_from_dict",
    "load_model", "resolve_template", "validate_template", "verify_tree",
]
__version__ = "0.1.0"
