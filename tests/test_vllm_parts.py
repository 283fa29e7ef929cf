"""tr_core.vllm's pure parts, without vLLM: context lookup, chain drafting, the shared matrix, calibration, the
version check and the corrected CPU expand kernel. (The engine-level tests run in vLLM's own environment:
tests/vllm/, `make test-vllm`.)"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from tr_core.vllm.calibration import BANDS, PRIOR_WEIGHT, Acceptance
from tr_core.vllm.chains import EMPTY, Contexts, batch_contexts, context_continuation, draft_chains
from tr_core.vllm.cpu_fixes import expand
from tr_core.vllm.matrix import SharedMatrix
from tr_core.vllm.support import UnsupportedVLLM, check_supported


def test_context_continuation_takes_the_latest_longest_match():
    tokens = np.array([5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7])
    found, n = context_continuation(tokens, 3)
    assert n == 3 and found.tolist() == [8, 9, 6]  # "5 6 7" matched at 0 (the later "6 7" is shorter)
    found, n = context_continuation(np.array([1, 2, 3, 4]), 3)
    assert n == 0 and found.tolist() == []
    found, n = context_continuation(np.array([4, 2, 4]), 5)
    assert n == 1 and found.tolist() == [2, 4]  # the continuation may run into the suffix itself


def chain_matrix(vocab=12, k=2):
    ids = torch.full((vocab, k), EMPTY, dtype=torch.int32)
    probs = torch.zeros((vocab, k), dtype=torch.float16)
    for a, b in [(1, 2), (2, 3), (3, 4), (4, 5)]:  # 1 -> 2 -> 3 -> 4 -> 5, then an empty row
        ids[a, 0], probs[a, 0] = b, 0.95
    return ids, probs


def no_context(batch, depth):
    return Contexts(torch.full((batch, depth), EMPTY), torch.zeros(batch, dtype=torch.long))


def test_matrix_chain_stops_at_an_empty_row_and_at_its_cap():
    ids, probs = chain_matrix()
    chains = draft_chains(torch.tensor([1, 1, 7]), no_context(3, 6), ids, probs, Acceptance(torch.device("cpu")),
                          0.01, torch.tensor([6, 2, 6]))
    drafts, kinds = chains.lists()
    assert drafts == [[2, 3, 4, 5], [2, 3], []]
    assert all(k == BANDS - 1 for k in kinds[0])  # stored with probability 0.95: the top band


def test_low_estimates_cut_the_chain():
    ids, probs = chain_matrix()
    probs[probs > 0] = 0.5  # band 2: prior rate 0.5, so reach 0.5, 0.25, ...
    chains = draft_chains(torch.tensor([1]), no_context(1, 6), ids, probs, Acceptance(torch.device("cpu")), 0.3,
                          torch.tensor([6]))
    assert chains.lists()[0] == [[2]]


def test_context_is_followed_while_its_estimate_beats_the_matrix():
    ids, probs = chain_matrix()
    probs[probs > 0] = 0.3  # weak matrix rows
    contexts = batch_contexts([np.array([9, 8, 7, 10, 11, 9, 8])], 4, torch.device("cpu"))  # "9 8" -> 7 10 11 9
    chains = draft_chains(torch.tensor([8]), contexts, ids, probs, Acceptance(torch.device("cpu")), 0.09,
                          torch.tensor([4]))
    drafts, kinds = chains.lists()
    assert drafts == [[7, 10, 11]]  # a 2-token match's prior rate is 0.45: reach 0.091 after 3, 0.041 after 4
    assert all(k >= BANDS for k in kinds[0])  # context kinds


def test_shared_matrix_update_writes_top_k_and_probabilities():
    matrix = SharedMatrix(vocab=6, device=torch.device("cpu"), k=2)
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]])
    matrix.update(torch.tensor([4, 2, 17]), logits)  # 17 is outside the vocabulary: skipped
    assert matrix.ids[4].tolist() == [1, 2] and matrix.ids[2, 0] == 0
    expected = torch.softmax(logits[0], -1)[1].item()
    assert abs(matrix.probs[4, 0].item() - expected) < 1e-3
    assert matrix.written() == 2 and matrix.updates == 2


def test_acceptance_counts_only_tokens_that_were_tried():
    acc = Acceptance(torch.device("cpu"))
    acc.record([[0, 1, 2, 3]], [1])  # first accepted, second rejected, the last two never reached
    tries = acc.summary()["tries"]
    assert tries[:4] == [1.0, 1.0, 0.0, 0.0]
    # band 0 (prior 0.1) accepted once: (0.1 * 8 + 1) / 9; band 1 (prior 0.3) rejected once: 0.3 * 8 / 9
    assert acc.rate(torch.tensor([0, 1])).tolist() == pytest.approx([1.8 / 9, 2.4 / 9])
    assert acc.rate(torch.tensor([2])).item() == pytest.approx(0.5)  # untouched
    assert PRIOR_WEIGHT == 8.0


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "nonsense"])
def test_unsupported_vllm_is_refused_by_name(version):
    with pytest.raises(UnsupportedVLLM, match=r"supported: vLLM 0\.32\.x"):
        check_supported(version)


def test_supported_vllm_passes():
    check_supported("0.32.0")
    check_supported("0.32.3.dev1+cpu")


def test_expand_spreads_float_values_over_tokens():
    out = torch.empty(6)
    expand(out, torch.tensor([0.5, -1.0, 0.7]), torch.tensor([2, 5, 6]), -1.0, 1.0)
    assert out.tolist() == pytest.approx([0.5, 0.5, 1.0, 1.0, 1.0, 0.7])


def test_importing_the_integration_does_not_import_vllm():
    code = "import sys, tr_core.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_vllm_benchmark_gives_every_cell_unseen_questions_of_every_task():
    from tr_core.vllm import bench

    args = bench.parse_args(["--questions", "bench/data/spec_bench_dev.jsonl", "--questions",
                             "bench/data/mbpp_dev.jsonl", "--per-task", "2", "--rounds", "2"])
    cells = bench.cell_prompts(args)
    assert list(cells) == ["0/1", "0/8", "1/1", "1/8"]
    seen = [m[0]["content"] for prompts in cells.values() for m in prompts]
    assert all(len(prompts) == 14 for prompts in cells.values()) and len(set(seen)) == len(seen) == 56
    later = bench.cell_prompts(bench.parse_args(["--questions", "bench/data/spec_bench_dev.jsonl", "--questions",
                                                 "bench/data/mbpp_dev.jsonl", "--per-task", "2", "--rounds", "2",
                                                 "--skip-per-task", "8"]))
    later_seen = [m[0]["content"] for prompts in later.values() for m in prompts]
    assert len(set(later_seen)) == 56 and not set(later_seen) & set(seen)  # questions 9-16 of each task
    assert all(len(prompts) == 14 for prompts in later.values())
    with pytest.raises(SystemExit, match="too few questions"):
        bench.cell_prompts(bench.parse_args(["--questions", "bench/data/spec_bench_dev.jsonl", "--per-task", "20"]))


def test_the_vllm_benchmark_counts_steps_and_identical_answers_over_its_cells():
    from tr_core.vllm import bench

    plain = {"0/1": {"seconds": 2.0, "answers": [[1, 2, 3, 4]], "accepted": 0.0, "drafted": 0.0},
             "1/1": {"seconds": 2.0, "answers": [[5, 6]], "accepted": 0.0, "drafted": 0.0},
             "0/8": {"seconds": 1.0, "answers": [[7]], "accepted": 0.0, "drafted": 0.0}}
    mine = {"0/1": {"seconds": 1.0, "answers": [[1, 2, 3, 4]], "accepted": 2.0, "drafted": 6.0},
            "1/1": {"seconds": 1.0, "answers": [[5, 9]], "accepted": 0.0, "drafted": 3.0},
            "0/8": {"seconds": 0.5, "answers": [[7]], "accepted": 0.0, "drafted": 0.0}}
    row = bench.summarise("token-recycling", 1, mine, plain)
    assert row["tokens"] == 6 and row["tok_s"] == 3.0 and row["per_round"] == [4.0, 2.0]
    assert row["tokens_per_step"] == 6 / 4 and row["identical"] == 1 and row["answers"] == 2
    assert row["drafted"] == 9.0 and row["accepted"] == 2.0
    assert "| token-recycling | 1 | 3.0 | 4.0, 2.0 | 1.50 | 9 | 2 | 1/2 |" in bench.table([row])
