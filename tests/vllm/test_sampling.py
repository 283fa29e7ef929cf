"""Sampling stays lossless: with vLLM's rejection sampler checking Token Recycling's drafts, the tokens drawn follow
the same distribution as without speculation (two-sample chi-square per position), and the same test tells
two different temperatures apart (so it can fail)."""
from __future__ import annotations

import math
from collections import Counter

import pytest
from vllm_support import TR, counters, make_llm, shut, model_dir  # noqa: F401 - model_dir is a fixture

PROMPT = [{"role": "user", "content": "Name the planets of the solar system, in order."}]
TEMPERATURE = 0.5  # random enough to spread over many answers, predictable enough for drafts to be accepted
SAMPLES = 400
LENGTH = 8
ENDED = -1  # the "token" at positions after an answer's end (the end is part of the distribution too)


@pytest.fixture(scope="module")
def engines(model_dir):
    # drafts whatever its estimates say (they are low for sampled answers), so that most steps test the sampler
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TR_VLLM_MIN_REACH", "0.01")
        plain, recycling = make_llm(model_dir, None), make_llm(model_dir, TR)
    yield plain, recycling
    shut(plain, recycling)


def draw(llm, temperature: float, offset: int = 0, batch: int = 25) -> list[list[int]]:
    """SAMPLES seeded answers of LENGTH tokens (seed offset + i for answer i), `batch` at a time.

    Batches stay small enough for their prompts to be scheduled whole: on CPUs, vLLM 0.32 fails a seeded request
    whose prompt chunked prefill splits ("CPU Generator does not use offset"), with or without speculation.
    """
    from vllm import SamplingParams

    answers = []
    for start in range(0, SAMPLES, batch):
        params = [SamplingParams(temperature=temperature, seed=offset + i, max_tokens=LENGTH)
                  for i in range(start, start + batch)]
        answers += [list(o.outputs[0].token_ids) for o in llm.chat([PROMPT] * batch, params, use_tqdm=False)]
    return [a + [ENDED] * (LENGTH - len(a)) for a in answers]  # an answer that stopped early: ENDED afterwards


def chi_square(a: list[int], b: list[int], least: int = 10) -> tuple[float, int]:
    """Two-sample chi-square statistic and degrees of freedom; categories seen < `least` times in all are pooled."""
    ca, cb = Counter(a), Counter(b)
    total = ca + cb
    common = [t for t, n in total.items() if n >= least]
    rows = [(ca[t], cb[t]) for t in common]
    rows.append((len(a) - sum(r[0] for r in rows), len(b) - sum(r[1] for r in rows)))
    rows = [r for r in rows if sum(r)]
    na, nb = len(a), len(b)
    stat = sum((x - na * (x + y) / (na + nb)) ** 2 / (na * (x + y) / (na + nb)) +
               (y - nb * (x + y) / (na + nb)) ** 2 / (nb * (x + y) / (na + nb)) for x, y in rows)
    return stat, max(len(rows) - 1, 1)


def critical(df: int, z: float = 3.72) -> float:
    """Chi-square quantile (Wilson-Hilferty); z = 3.72 is p = 1e-4 one-sided, so 8 positions stay under 0.001."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def worst_position(x: list[list[int]], y: list[list[int]]) -> float:
    """The largest statistic/critical ratio over the positions (> 1: the distributions differ)."""
    ratios = []
    for p in range(LENGTH):
        stat, df = chi_square([s[p] for s in x], [s[p] for s in y])
        ratios.append(stat / critical(df))
    return max(ratios)


def test_sampled_tokens_follow_the_plain_distribution(engines):
    plain, recycling = engines
    draw(recycling, TEMPERATURE, offset=10_000)  # the matrix learns this prompt first, so drafts are made
    before = counters(recycling)
    spec = draw(recycling, TEMPERATURE)
    after = counters(recycling)
    assert after["accepted"] - before["accepted"] > SAMPLES // 4  # drafts were accepted: the sampler was exercised
    assert len({tuple(s) for s in spec}) > 10  # and it sampled: many different answers
    assert worst_position(draw(plain, TEMPERATURE), spec) < 1.0


def test_the_check_tells_two_temperatures_apart(engines):
    plain, _ = engines
    assert worst_position(draw(plain, TEMPERATURE), draw(plain, 2 * TEMPERATURE, offset=20_000)) > 1.0
