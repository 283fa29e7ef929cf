"""Shared parts of tests/vllm/ (vLLM's own environment only, `make test-vllm`): the embedded model's folder, engines
in float32, vLLM's counters. Not a conftest.py: a second module named `conftest` would shadow tests/conftest.py
for the main suite's `from conftest import ...`. The main suite does not collect this folder unless vLLM is
installed (tests/conftest.py)."""
from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB of KV cache per engine
DATA = Path(__file__).resolve().parents[2] / "bench" / "data"
TR = {"method": "custom_class", "model": "tr_core.vllm.TokenRecyclingProposer", "num_speculative_tokens": 6}


def questions(n_spec: int = 8, n_mbpp: int = 4) -> list[list[dict[str, str]]]:
    """First turns of development questions, spread over tasks, as chat messages."""
    spec = [json.loads(line) for line in (DATA / "spec_bench_dev.jsonl").read_text().splitlines()]
    mbpp = [json.loads(line) for line in (DATA / "mbpp_dev.jsonl").read_text().splitlines()]
    rows = spec[:: len(spec) // n_spec][:n_spec] + mbpp[:: len(mbpp) // n_mbpp][:n_mbpp]
    return [[{"role": "user", "content": r["turns"][0]}] for r in rows]


@pytest.fixture(scope="session")
def model_dir() -> str:
    from tr_core.models import resolve_source

    return resolve_source(None)[0]


def make_llm(model_dir: str, spec: dict | None, **extra):
    from vllm import LLM

    args = {"dtype": "float32", "max_model_len": 1024, "seed": 0, "enforce_eager": True, "disable_log_stats": False}
    return LLM(model=model_dir, speculative_config=spec, **{**args, **extra})


def counters(llm) -> dict[str, float]:
    """vLLM's cumulative counters of this engine that the tests read."""
    wanted = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
              "vllm:spec_decode_num_accepted_tokens": "accepted", "vllm:num_preemptions": "preemptions"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for metric in llm.get_metrics():
        if metric.name in wanted:
            out[wanted[metric.name]] = float(metric.value)
    return out


def shut(*llms) -> None:
    """Stop the engines' processes now rather than at interpreter exit."""
    for llm in llms:
        llm.llm_engine.engine_core.shutdown()
    gc.collect()
