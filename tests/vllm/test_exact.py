"""Greedy float32 output of vLLM + Token Recycling equals vLLM's without speculation: alone, batched, and under a
scheduler pushed to chunk prefills and pre-empt requests."""
from __future__ import annotations

import pytest
from vllm_support import TR, counters, make_llm, questions, shut, model_dir  # noqa: F401 - model_dir is a fixture

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def engines(model_dir):
    plain, recycling = make_llm(model_dir, None), make_llm(model_dir, TR)
    yield plain, recycling
    shut(plain, recycling)


def greedy(llm, prompts, max_tokens=MAX_TOKENS, each=None):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n) for n in each] if each else \
        SamplingParams(temperature=0, max_tokens=max_tokens)
    return [list(o.outputs[0].token_ids) for o in llm.chat(prompts, params, use_tqdm=False)]


def test_batched_answers_are_identical_and_drafts_are_accepted(engines):
    plain, recycling = engines
    prompts = questions()
    before = counters(recycling)
    expected, got = greedy(plain, prompts), greedy(recycling, prompts)
    after = counters(recycling)
    assert got == expected
    drafts, drafted, accepted = (after[k] - before[k] for k in ("drafts", "drafted", "accepted"))
    assert accepted > 0.2 * sum(map(len, got)) / 2, (drafts, drafted, accepted)  # the method works, not a no-op
    # chains are sized per request: on average shorter than num_speculative_tokens, longer than one token
    assert 1.0 < drafted / drafts < TR["num_speculative_tokens"]


def test_one_request_at_a_time_is_identical(engines):
    plain, recycling = engines
    for prompt in questions(4, 2):
        assert greedy(recycling, [prompt]) == greedy(plain, [prompt])


def test_scheduler_pressure_chunked_prefill_preemption_and_mixed_lengths(model_dir):
    """A tiny KV cache and token budget: prompts arrive in chunks, requests are pre-empted and resumed, and
    requests of different lengths finish at different steps, with every answer still identical."""
    # 4 blocks of 128 tokens (a 384-token limit) for 6 requests of ~80-180 tokens each; prompts are cut into 96-token chunks
    pressure = {"num_gpu_blocks_override": 4, "max_model_len": 384, "max_num_batched_tokens": 96, "max_num_seqs": 6,
                "enable_prefix_caching": False}
    plain, recycling = make_llm(model_dir, None, **pressure), make_llm(model_dir, TR, **pressure)
    try:
        prompts = [p for p in questions(16, 8) if len(p[0]["content"]) < 400][:10]  # each fits 384 tokens
        lengths = [24 + 17 * (i % 5) for i in range(len(prompts))]
        expected, got = greedy(plain, prompts, each=lengths), greedy(recycling, prompts, each=lengths)
        stats = counters(recycling)
    finally:
        shut(plain, recycling)
    assert got == expected
    assert all(len(a) <= n for a, n in zip(got, lengths))
    assert stats["preemptions"] > 0 and stats["accepted"] > 0, stats
