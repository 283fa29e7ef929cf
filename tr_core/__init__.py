"""Token Recycling Studio core: lossless Token Recycling speculative decoding for transformers causal LMs.

Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with Token
Recycling", ACL 2025 (arXiv 2408.08696).

The public API is what this file exports (the engine, its settings and events, the draft trees, the adjacency
matrix, model loading), and beside it:
- tr_core.hf.generate: Token Recycling as transformers' `generate(custom_generate=...)`;
- tr_core.warm.warm_start(engine, model_name): start an engine's matrix warm.

The rooms, lowest first; each imports only its own room or lower ones (tests/test_architecture.py):
- tr_core/*.py, the library: engine, config, events, sampling, reduce, packet, tree, matrix, the drafters (drafters,
  adaptive, hybrid, context, trust, cost), model access (models, runner, kv_cache, hf, warm, token_text), the CPU's
  timed matrix products (kernels, tuning, plan_cache) and the machine they run on (machine), a decode
  recorded (trace) and the speed meter that times it against plain decoding (meter);
- the views (present/) and the studio (studio/, app.py) sit outside the library, beside it in a checkout;
- tr_core.bench: the benchmark, the forward-cost profile and their question files;
- tr_core.cli: the command line (`token-recycling` = `python -m tr_core`);
- tr_core.vllm, beside the benchmark: the vLLM integration (below the command line, over the rest).
`import tr_core` loads the library alone: nothing of the views, the benchmark, the command line or the studio.
"""
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
