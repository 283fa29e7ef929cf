"""Row-wise attention of a batch's forward (tr_core/rows_attention.py): each row reads only its own keys, and
computes what it computes alone; other forwards are untouched."""
from __future__ import annotations

import threading

import pytest
import torch
from conftest import tiny_model
from test_batch import alone, batched, ragged_prompts

from tr_core import DecodeConfig, rows_attention
from tr_core.runner import ModelRunner


def counting(monkeypatch) -> list[int]:
    """Record the key length of every per-row call the row-wise attention makes."""
    from transformers import AttentionInterface

    seen: list[int] = []
    inner = AttentionInterface._global_mapping["sdpa"]

    def spy(module, query, key, value, mask, **kwargs):
        if getattr(rows_attention._LOCAL, "rows", None) is not None and query.shape[0] == 1:
            seen.append(key.shape[2])
        return inner(module, query, key, value, mask, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", spy)
    return seen


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_each_row_reads_its_own_keys_and_gets_its_tokens_alone(arch, monkeypatch):
    """Rows of 3 to 28 prompt tokens: every per-row call reads at most its own row's keys (never the longest
    row's), and each answer equals itself alone, greedy and with trees, as with the padded call."""
    model = tiny_model(arch)
    prompts = ragged_prompts(6)
    monkeypatch.setattr(rows_attention, "CALL_KEYS", 0)  # calls cost nothing: every row alone
    seen = counting(monkeypatch)
    for cfg in (DecodeConfig(max_new_tokens=24, plain=True), DecodeConfig(max_new_tokens=24, template="hybrid")):
        seen.clear()
        tokens, _ = batched(model, prompts, cfg, max_rows=6)
        assert tokens == alone(model, prompts, cfg)
        assert seen and min(seen) < max(map(len, prompts))  # a short row's call never reads the longest row's
        with monkeypatch.context() as patch:
            patch.setattr(rows_attention, "CALL_KEYS", 12)  # rows of near lengths share calls
            assert batched(model, prompts, cfg, max_rows=6)[0] == tokens
        with monkeypatch.context() as patch:
            patch.setattr(rows_attention, "wrappable", lambda runner: None)  # the padded call, for comparison
            assert batched(model, prompts, cfg, max_rows=6)[0] == tokens


def test_neighbours_of_near_lengths_share_a_call():
    assert rows_attention.chunks([100, 110, 950, 940, 80], call_keys=256) == [(0, 2, 110), (2, 4, 950), (4, 5, 80)]
    assert rows_attention.chunks([100, 110, 950], call_keys=10_000) == [(0, 3, 950)]
    assert rows_attention.chunks([5, 5, 5], call_keys=0) == [(0, 3, 5)]  # equal lengths: one call costs no more
    assert rows_attention.chunks([5, 6], call_keys=0) == [(0, 1, 5), (1, 2, 6)]


def test_the_model_gets_its_attention_back_and_other_threads_keep_theirs():
    """While one thread's batched forward runs row-wise, another thread's forward of the same model is the usual
    one; afterwards the model names its own attention again."""
    model = tiny_model("llama")
    runner = ModelRunner(model)
    ids = torch.tensor([[3, 4, 5, 6]])
    expected = model(ids).logits
    inside, outside = threading.Event(), threading.Event()
    got = {}

    def other() -> None:
        inside.wait(10)
        got["logits"] = model(ids).logits
        outside.set()

    thread = threading.Thread(target=other)
    thread.start()
    with rows_attention.rows(runner, [2, 4], masked=False):
        assert model.config._attn_implementation == rows_attention.PREFIX + "sdpa"
        inside.set()
        assert outside.wait(10)
    thread.join()
    assert torch.equal(got["logits"], expected)
    assert model.config._attn_implementation == "sdpa"


def test_not_row_wise_off_the_cpu_or_for_unregistered_attention():
    model = tiny_model("llama", attn="eager")
    assert rows_attention.wrappable(ModelRunner(model)) is None
    runner = ModelRunner(tiny_model("llama"))
    assert rows_attention.wrappable(runner) == "sdpa"
    runner.device = torch.device("meta")
    assert rows_attention.wrappable(runner) is None


def test_a_config_with_other_attention_keeps_it():
    """A part of the model with attention of its own (a vision tower's eager, say) is left alone, during and after."""
    import copy

    model = tiny_model("llama")
    model.tower = torch.nn.Module()
    model.tower.config = copy.deepcopy(model.config)
    model.tower.config._attn_implementation_internal = "eager"
    with rows_attention.rows(ModelRunner(model), [2, 4], masked=False):
        assert model.tower.config._attn_implementation == "eager"
        assert model.config._attn_implementation == rows_attention.PREFIX + "sdpa"
    assert (model.tower.config._attn_implementation, model.config._attn_implementation) == ("eager", "sdpa")


def test_a_grown_cache_holds_zeros_past_what_was_written():
    """A batch's row may read slots past its own that no forward wrote (masked): they are zeros, never left over
    memory a finite mask could not hide."""
    from tr_core.kv_cache import _BufferLayer

    states = torch.ones(2, 1, 5, 4)
    for _ in range(20):  # freed NaN blocks of the grown size: an uninitialised buffer would often be one of them
        junk = [torch.full((2, 1, 600, 4), float("nan")) for _ in range(2)]
        del junk
        layer = _BufferLayer()
        layer.update(states, states)
        layer.reserve(600)
        assert torch.equal(layer._k[:, :, :5], states)
        assert not layer._k[:, :, 5:].any() and not layer._v[:, :, 5:].any()  # NaN counts as nonzero too


def test_a_batch_cache_grows_before_the_forward_keeping_every_rows_entries():
    """BatchKVCache.begin_forward makes room for the trees before the forward (whose time the batch's cost model
    learns), keeping each row's committed entries, also a joined row longer than the last forward read."""
    from tr_core.kv_cache import BatchKVCache, TreeKVCache

    solos = []
    for n in (3, 256):
        solo = TreeKVCache()
        solo.update(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 1, n, 2).clone(),
                    torch.ones(1, 1, n, 2), 0)
        solos.append(solo)
    batch = BatchKVCache()
    for solo in solos:
        batch.add_row(solo)
    layer = batch.layers[0]
    assert layer._k.shape[2] == 256
    batch.begin_forward(4)
    assert layer._k.shape[2] >= 260 and layer.starts is not None  # grown, the forward not yet run
    assert layer._k[1, 0, :256, 0].tolist() == list(range(256)) and layer._k[0, 0, :3, 0].tolist() == [0, 1, 2]
