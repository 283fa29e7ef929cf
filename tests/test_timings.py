"""Timings you can trust (tr_core/cost.py): a forward-cost curve records how steady its timings were, re-times a
disturbed size a bounded number of times, and says when it is still too unsteady to be shown as fact."""
from __future__ import annotations

import pytest
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from tr_core import Engine
from tr_core import cost as cost_mod
from tr_core.cost import ForwardCost, relative_spread


def test_relative_spread_is_the_medians_distance_above_the_fastest():
    assert relative_spread([10.0]) == 0.0 and relative_spread([]) == 0.0
    assert relative_spread([10.0, 12.0]) == pytest.approx(0.2)
    assert relative_spread([12.0, 10.0, 30.0]) == pytest.approx(0.2)  # one disturbed run does not decide it
    assert relative_spread([10.0, 30.0, 31.0]) == pytest.approx(2.0)


def test_a_curve_says_how_steady_it_was():
    curve = ForwardCost()
    curve.set_measured({1: [10.0, 10.5], 2: [12.0, 12.2]}, max_tokens=2)
    assert curve.measured and curve.steady and curve.spread == pytest.approx(0.05)
    curve.set_measured({1: [10.0, 10.5], 2: [12.0, 24.0]}, max_tokens=2)
    assert curve.measured and not curve.steady and curve.spread == pytest.approx(1.0)


@pytest.mark.parametrize("settles", [True, False])
def test_the_probe_retimes_a_disturbed_size_a_bounded_number_of_times(monkeypatch, settles):
    calls: list[list[int]] = []

    def fake(runner, context, sizes, repeats=2, warmup=1):
        calls.append(list(sizes))
        first = len(calls) == 1
        return {n: ([10.0 * n, 25.0 * n] if (n == 2 and (first or not settles)) else [10.0 * n] * repeats)
                for n in sizes}

    monkeypatch.setattr(cost_mod, "measure_forward_costs", fake)
    runner = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), tune_kernels=False).runner
    curve = ForwardCost()
    curve.probe(runner, [3, 4, 5], max_tokens=4)
    assert calls[0] == [1, 2, 3, 4] and all(c == [2] for c in calls[1:])
    if settles:
        assert len(calls) == 2 and curve.steady  # [20, 50, 20, 20]: the median is 20 again
    else:
        assert len(calls) == 1 + cost_mod.MAX_RETIMES and not curve.steady and curve.spread == pytest.approx(1.5)


def test_a_models_forwards_are_probed_once_for_all_its_engines(monkeypatch):
    """A crowd's sessions are engines of one model: the first probe's times serve the rest (no forward timed
    again while others wait), unless the products run another way (`variant`) or the size budget differs."""
    calls: list[list[int]] = []

    def fake(runner, context, sizes, repeats=2, warmup=1):
        calls.append(list(sizes))
        return {n: [10.0 * n] * repeats for n in sizes}

    monkeypatch.setattr(cost_mod, "measure_forward_costs", fake)
    model = tiny_model("llama")
    runners = [Engine(model, TinyTokenizer(TINY_VOCAB), tune_kernels=False).runner for _ in range(3)]
    curves = [ForwardCost() for _ in range(3)]
    for runner, curve in zip(runners, curves):
        curve.probe_once(runner, [3, 4, 5], max_tokens=4)
    assert calls == [[1, 2, 3, 4]]
    assert all(c.measured and c.ms == curves[0].ms for c in curves)
    ForwardCost().probe_once(runners[0], [3, 4, 5], max_tokens=4, variant=True)  # exact mode's products
    ForwardCost().probe_once(runners[0], [3, 4, 5], max_tokens=8)
    assert len(calls) == 3
    other = Engine(tiny_model("qwen2"), TinyTokenizer(TINY_VOCAB), tune_kernels=False).runner
    ForwardCost().probe_once(other, [3, 4, 5], max_tokens=4)
    assert len(calls) == 4
