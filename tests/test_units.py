"""The pure parts on hand-built trees and matrices: templates, buffers, BFS draft, mask, verification, update, cache."""
from __future__ import annotations

import re
import zipfile

import pytest
import torch

from tr_core import AdjacencyMatrix, DecodeConfig, TemplateError, build_tree, validate_template
from tr_core.adaptive import AdaptiveDrafter
from tr_core.cost import ForwardCost
from tr_core.growth import ancestor_mask
from tr_core.kv_cache import TreeKVCache
from tr_core.reduce import log_normalizer, row_argmax, top_rows
from tr_core.sampling import build_processors, check_per_node, choose_tokens, gumbel_noise, node_prefixes, process
from tr_core.tree import TEMPLATES, attention_bias, bfs_draft, resolve_template, tree_from_parents
from tr_core.verify import path_to, verify_tree

# A hand-built tree:      0
#                       /   \
#                      1     2        paths (0,), (1,), (0,0), (0,1), (0,0,0)
#                     / \
#                    3   4
#                    |
#                    5
PATHS = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]


def small_tree():
    return build_tree("t", validate_template(PATHS, k=2))


def test_paper_template_shape():
    name, paths = resolve_template("2.2.2", k=8)
    tree = build_tree(name, paths)
    assert tree.size == 81  # 80 draft nodes + the root
    assert tree.max_depth == 6
    counts = [end - start for start, end in tree.level_slices]
    assert counts == [8, 21, 25, 15, 8, 3]
    i = paths.index((0, 1)) + 1  # node [0,1] is candidate 1 of candidate 0 of the root
    assert tree.ranks_list[i] == 1 and tree.parents_list[i] == paths.index((0,)) + 1


def test_buffers_of_hand_built_tree():
    tree = small_tree()
    assert tree.parents_list == (-1, 0, 0, 1, 1, 3)
    assert tree.depths_list == (0, 1, 1, 2, 2, 3)
    assert tree.ranks_list == (-1, 0, 1, 0, 1, 0)
    assert tree.level_slices == ((1, 3), (3, 5), (5, 6))
    expected_mask = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.tree_mask, expected_mask)


@pytest.mark.parametrize("bad, message", [
    ([(0, 0)], "no parent"),
    ([(0,), (0,)], "duplicate"),
    ([(0,), (2,)], "outside"),
    ([(0,), ()], "non-empty"),
    ("2.2.2x", "unknown template"),
])
def test_template_validation(bad, message):
    with pytest.raises(TemplateError, match=message):
        if isinstance(bad, str):
            resolve_template(bad, k=2)
        else:
            validate_template(bad, k=2)


def test_every_named_template_is_valid():
    for name in TEMPLATES:
        _, paths = resolve_template(name, k=8)
        assert build_tree(name, paths).size == len(paths) + 1


def test_bfs_draft_gathers_candidates_level_by_level():
    tree = small_tree()
    table = torch.zeros(10, 2, dtype=torch.int32)
    table[7] = torch.tensor([3, 4])  # after 7: 3 then 4
    table[3] = torch.tensor([5, 6])
    table[5] = torch.tensor([9, 8])
    tokens = bfs_draft(table, torch.tensor([7]), tree)
    # node: 0=root 7, 1=[0]->3, 2=[1]->4, 3=[0,0]->5, 4=[0,1]->6, 5=[0,0,0]->9
    assert tokens.tolist() == [7, 3, 4, 5, 6, 9]


def test_attention_bias_prefix_visible_tree_by_ancestry():
    tree = small_tree()
    bias = attention_bias(tree.tree_mask, past=3, dtype=torch.float32)
    assert bias.shape == (1, 1, 6, 9)
    visible = bias[0, 0] == 0
    assert visible[:, :3].all()  # every node sees the whole prefix
    assert torch.equal(visible[:, 3:], tree.tree_mask)
    assert (bias[0, 0][~visible] == torch.finfo(torch.float32).min).all()


def test_attention_bias_sliding_window_hides_far_keys():
    tree = small_tree()
    bias = attention_bias(tree.tree_mask, past=10, dtype=torch.float32, window=4, depths=tree.depths)
    visible = bias[0, 0] == 0
    # node 5 sits at position 13: it may see keys at positions 10..13 only (distance < 4)
    assert visible[5].nonzero().flatten().tolist() == [10, 11, 13, 15]  # prefix 10, root(10)->col 10, node1 col 11...
    assert not visible[5, :10].any()


def test_verify_walk_picks_longest_agreeing_path_and_bonus():
    tree = small_tree()
    tokens = torch.tensor([7, 3, 4, 5, 6, 9])
    # model: after 7 -> 3, after 3 -> 6, after 6 -> 2 ; node 4 (token 6) is accepted, node 3 (token 5) is not
    targets = torch.tensor([3, 6, 0, 9, 2, 0])
    best = verify_tree(tokens, targets, tree.parents, tree.depths, tree.tree_mask)
    assert int(best) == 4
    assert path_to(tree.parents_list, 4) == [0, 1, 4]
    assert int(targets[best]) == 2  # the bonus token


def test_verify_rejects_a_match_below_a_mismatch():
    tree = small_tree()
    tokens = torch.tensor([7, 3, 4, 5, 6, 9])
    targets = torch.tensor([8, 5, 0, 9, 0, 0])  # root's choice 8 matches nothing; deeper "matches" don't count
    assert int(verify_tree(tokens, targets, tree.parents, tree.depths, tree.tree_mask)) == 0


def test_verify_a_root_alone_accepts_nothing():
    """A plain or zero-draft step verifies the root alone: its end of path is the root, a 0-d index like any other."""
    best = verify_tree(torch.tensor([7]), torch.tensor([3]), torch.zeros(1, dtype=torch.long),
                       torch.zeros(1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool))
    assert best.shape == () and int(best) == 0


def test_matrix_update_topk_and_duplicate_rule():
    m = AdjacencyMatrix(vocab_size=6, k=2)
    tokens = torch.tensor([4, 2, 4])  # token 4 at nodes 0 and 2: node 0 (first in BFS order) wins
    logits = torch.tensor([
        [0.0, 5.0, 1.0, 0.0, 0.0, 4.0],
        [3.0, 0.0, 0.0, 2.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 9.0, 8.0, 0.0],
    ])
    first, _, _ = m.update(tokens, logits)
    assert first.tolist() == [True, True, False]
    assert m.table[4].tolist() == [1, 5]
    assert m.table[2].tolist() == [0, 3]
    assert m.rows_filled == 2
    p = torch.softmax(logits[0], -1)
    assert m.get_probs()[4].tolist() == pytest.approx([p[1].item(), p[5].item()], abs=1 / 255)
    # with the accepted path known, the token's node ON the path wins (its context is the text now committed): a row
    # shown after a step then agrees with the path it accepted, even where a shallower rejected node had the token
    m = AdjacencyMatrix(vocab_size=6, k=2)
    first, _, _ = m.update(tokens, logits, path=torch.tensor([False, False, True]))
    assert first.tolist() == [False, True, True] and m.table[4].tolist() == [3, 4] and m.table[2].tolist() == [0, 3]
    first, _, _ = m.update(tokens, logits, path=torch.tensor([True, False, False]))  # off the path: BFS order
    assert first.tolist() == [True, True, False] and m.table[4].tolist() == [1, 5]
    # twice on the path (root '4' ... '4'): the deeper node wins, the token's last occurrence in the text, as one
    # token at a time would leave the row ("ps , ... ps ." : the row of 'ps' starts with '.')
    first, _, _ = m.update(tokens, logits, path=torch.tensor([True, True, True]))
    assert first.tolist() == [False, True, True] and m.table[4].tolist() == [3, 4]


@pytest.mark.parametrize("vocab,k", [(49152, 8), (1000, 8), (257, 3), (17, 8), (12, 1)])
def test_chunked_argmax_and_topk_equal_torch(vocab, k):
    """reduce.top_rows: argmax exactly torch.argmax (first maximum on ties), top-k values exactly torch.topk's."""
    gen = torch.Generator().manual_seed(vocab + k)
    rows = [torch.randn(40, vocab, generator=gen) * 4,
            torch.randint(0, 4, (40, vocab), generator=gen).float(),  # many ties, also across chunks
            torch.zeros(3, vocab)]  # every entry tied
    rows += [r[:1] for r in rows] + [r[:2] for r in rows]  # one row (a plain or zero-draft step's) and two
    for logits in rows:
        argmax, values, ids = top_rows(logits, k)
        assert torch.equal(argmax, logits.argmax(dim=-1))
        assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
        assert torch.equal(values, torch.topk(logits, k, dim=-1).values)
        assert torch.equal(logits.gather(1, ids), values)  # the ids carry those values
        assert all(len(set(r)) == k for r in ids.tolist())  # distinct tokens
    wide = torch.randn(5, vocab + 3, generator=gen)[:, :vocab]  # a non-contiguous slice, as the matrix takes
    assert torch.equal(top_rows(wide, k)[0], wide.argmax(dim=-1))
    assert torch.equal(row_argmax(wide), wide.argmax(dim=-1)) and torch.equal(row_argmax(wide[:1]), wide[:1].argmax(-1))
    lse = log_normalizer(rows[0].clone(), rows[0].amax(-1, keepdim=True), overwrite=True)
    assert torch.allclose(lse, torch.logsumexp(rows[0], -1, keepdim=True), atol=1e-4)


def test_matrix_size_and_rows_from_logits():
    m = AdjacencyMatrix(vocab_size=49152, k=8)
    assert m.size_mb < 2.25  # int32 ids (1.57 MB) + uint8 probabilities + flags + int32 write stamps (0.2 MB)
    with pytest.raises(ValueError, match="100 entries"):
        m.update(torch.tensor([0]), torch.zeros(1, 100))


def test_decode_config_takes_numbers_of_any_type_and_refuses_what_would_fail_later():
    import numpy as np

    from tr_core.config import DecodeConfigError

    cfg = DecodeConfig(temperature=2, top_p=np.float32(0.5), max_new_tokens=np.int64(7), seed=np.int32(3))
    assert type(cfg.temperature) is float and cfg.temperature == 2.0 and type(cfg.max_new_tokens) is int
    assert build_processors(cfg)  # transformers' temperature warper refuses an int: it gets a float
    for bad, message in ((dict(seed=1.5), "seed must be an integer"), (dict(seed="3"), "seed must be an integer"),
                         (dict(temperature="hot"), "temperature must be a number"),
                         (dict(max_new_tokens=True), "max_new_tokens must be an integer"),
                         (dict(temperature=1e-40), "temperature must be 0 (greedy) or from 1e-06 up")):
        with pytest.raises(DecodeConfigError, match=re.escape(message)):
            DecodeConfig(**bad)


def test_matrix_save_load_roundtrip_and_bad_files(tmp_path):
    m = AdjacencyMatrix(vocab_size=6, k=2)
    m.update(torch.tensor([1]), torch.tensor([[0.0, 0.0, 3.0, 5.0, 0.0, 0.0]]))
    path = tmp_path / "m.pt"
    m.save(path)
    other = AdjacencyMatrix(vocab_size=6, k=2)
    other.load(path)
    assert torch.equal(other.table, m.table) and torch.equal(other.probs, m.probs) and other.rows_filled == 1
    # bad or mismatched files raise and leave the current matrix untouched
    (tmp_path / "junk.pt").write_bytes(b"not a matrix")
    wrong = AdjacencyMatrix(vocab_size=7, k=2)
    wrong.save(tmp_path / "wrong.pt")
    fields = {"format": "token-recycling-adjacency-matrix/1", "vocab_size": 6, "k": 2, "table": m.table,
              "probs": m.probs, "filled": m.filled}
    for name, change in (("complex", {"table": m.table.to(torch.complex64)}), ("floatprobs", {"probs": m.probs - 3.7}),
                         ("intfilled", {"filled": m.filled.long()})):
        torch.save({**fields, **change}, tmp_path / f"{name}.pt")
    # a zip bomb: a valid torch file of 4 MB of zeros, stored compressed, where a 6 x 2 matrix needs bytes
    torch.save({**fields, "pad": torch.zeros(1 << 20)}, tmp_path / "big.pt")
    with zipfile.ZipFile(tmp_path / "big.pt") as src, \
            zipfile.ZipFile(tmp_path / "bomb.pt", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert (tmp_path / "bomb.pt").stat().st_size < 100_000
    (tmp_path / "folder.pt").mkdir()
    for unwritable in (tmp_path / "folder.pt", tmp_path / "no" / "such.pt"):  # an OSError, and no file left behind
        with pytest.raises(OSError):
            m.save(unwritable)
        assert not unwritable.with_name(unwritable.name + ".tmp").exists()
    reasons = {"junk": "not a file written by torch.save", "wrong": "vocabulary 7", "missing": "not found",
               "complex": "wrong types", "floatprobs": "wrong types", "intfilled": "wrong types", "bomb": "unpacks to"}
    for name, reason in reasons.items():
        with pytest.raises(ValueError, match=reason) as raised:
            other.load(tmp_path / f"{name}.pt")
        assert len(str(raised.value)) < 200 + len(str(tmp_path))  # one short line, not torch's page of advice
        assert torch.equal(other.table, m.table) and other.rows_filled == 1


def test_cache_keeps_only_accepted_entries_in_place():
    cache = TreeKVCache()
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4)  # 3 committed tokens
    cache.update(k, k + 100, 0)
    tree_k = torch.arange(5, dtype=torch.float32).view(1, 1, 5, 1).expand(1, 2, 5, 4) + 1000  # 5 tree nodes
    keys, _ = cache.update(tree_k, tree_k + 100, 0)
    assert keys.shape[2] == 8
    buffer_before = cache.layers[0]._k
    cache.keep(3, [0, 2, 4])  # root, node 2, node 4 accepted
    layer = cache.layers[0]
    assert layer.get_seq_length() == 6 and layer._k is buffer_before  # compacted in place, no reallocation
    assert layer.keys[0, 0, :3].equal(k[0, 0])
    assert layer.keys[0, 0, 3:, 0].tolist() == [1000, 1002, 1004]
    assert layer.values[0, 1, 3:, 0].tolist() == [1100, 1102, 1104]


def test_cache_grows_by_a_quarter_and_crops():
    cache = TreeKVCache()
    capacities = set()
    for _ in range(1200):
        cache.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2), 0)
        capacities.add(cache.layers[0]._k.shape[2])
    assert sorted(capacities) == [256, 512, 768, 1024, 1280]  # 256 at least, else a quarter: 1024 + 256
    assert cache.get_seq_length() == 1200 and cache.layers[0].keys[0, 0, :, 0].eq(1).all()
    cache.crop(300)
    cache.crop(-10)  # transformers' meaning: negative removes that many
    assert cache.get_seq_length() == 290
    cache.crop(100)  # positive keeps that many
    assert cache.get_seq_length() == 100
    cache.crop(500)
    assert cache.get_seq_length() == 100


def test_processors_are_transformers_own_in_generates_order_and_unsafe_ones_are_refused():
    from transformers import (NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                              TopKLogitsWarper, TopPLogitsWarper)

    procs = build_processors(DecodeConfig(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.3))
    assert [type(p) for p in procs] == [RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                                        TopPLogitsWarper]
    assert len(build_processors(DecodeConfig())) == 0  # greedy without a penalty: plain argmax
    with pytest.raises(ValueError, match="NoRepeatNGramLogitsProcessor cannot be applied per tree node"):
        check_per_node(NoRepeatNGramLogitsProcessor(2))


def test_repetition_penalty_sees_each_nodes_own_prefix():
    tree = small_tree()  # node 5's path: 0 -> 1 -> 3 -> 5
    tokens = torch.tensor([7, 11, 12, 13, 14, 15])
    context = torch.tensor([2, 3, 7])  # the committed text ends with the root token
    prefixes = node_prefixes(context, tokens, tree.tree_mask)
    assert set(prefixes[5].tolist()) == {2, 3, 7, 11, 13, 15} and set(prefixes[2].tolist()) == {2, 3, 7, 12}
    logits = torch.ones(6, 20)
    scores = process(logits, build_processors(DecodeConfig(repetition_penalty=2.0)), prefixes)
    assert scores[5, 15] == 0.5 and scores[5, 12] == 1.0 and scores[2, 12] == 0.5 and scores[2, 11] == 1.0
    # the same as transformers' processor on node 5's real prefix
    from transformers import RepetitionPenaltyLogitsProcessor

    real = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([[2, 3, 7, 11, 13, 15]]), torch.ones(1, 20))
    assert torch.equal(scores[5], real[0])


def test_gumbel_noise_is_a_function_of_seed_and_position():
    a = gumbel_noise(3, torch.tensor([10, 11]), 100)
    b = gumbel_noise(3, torch.tensor([11]), 100)
    assert torch.equal(a[1], b[0])
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(gumbel_noise(4, torch.tensor([10]), 100)[0], a[0])
    assert abs(a.mean().item() - 0.5772) < 0.2  # Gumbel mean = Euler-Mascheroni constant


def test_sampled_token_follows_the_distribution():
    """Chi-square test: argmax(processed logits + seeded Gumbel noise) over many seeds ~ softmax."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5]])
    cfg = DecodeConfig(temperature=0.9)
    probs = torch.softmax(logits[0] / 0.9, -1)
    n = 4000
    counts = torch.zeros(8)
    for seed in range(n):
        scores = process(logits, build_processors(cfg), None)
        tok = choose_tokens(scores, cfg.with_(seed=seed), first_position=5, depths=torch.tensor([0]), levels=1)
        counts[tok] += 1
    expected = probs * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3, f"chi-square {chi2:.1f} (7 d.o.f., p = 0.001 critical value 24.3); counts {counts.tolist()}"


def test_adaptive_tree_is_best_first_and_prefix_closed():
    drafter = AdaptiveDrafter(torch.device("cpu"))
    matrix = AdjacencyMatrix(10, k=2)
    matrix.table[7] = torch.tensor([3, 4]); matrix.probs[7] = torch.tensor([250, 3])
    matrix.table[3] = torch.tensor([5, 6]); matrix.probs[3] = torch.tensor([240, 10])
    matrix.table[5] = torch.tensor([9, 8]); matrix.probs[5] = torch.tensor([200, 50])
    matrix.filled[[7, 3, 5]] = True  # rows never written are not drafted
    grown = drafter.grow(matrix, torch.tensor([7]), budget=4, max_depth=3)
    tree = drafter.take(grown, 3, max_depth=3)
    assert tree.tokens.tolist() == [7, 3, 5, 9]  # the confident chain, not the unlikely siblings
    assert tree.size == 4 and tree.extras["bins"].shape == (4,) and tree.node_probs.shape == (4,)
    assert tree.parents.tolist() == [0, 0, 1, 2]
    assert tree.tree_mask.tolist() == [[True, False, False, False], [True, True, False, False],
                                       [True, True, True, False], [True, True, True, True]]
    expected = grown.expected.tolist()
    assert expected[0] == 0 and all(b >= a for a, b in zip(expected, expected[1:]))


@pytest.mark.parametrize("budget,depth", [(1, 1), (8, 3), (20, 9), (80, 8), (300, 4)])
def test_host_grown_tree_equals_the_device_one(budget, depth):
    """On a CPU the tree is grown best-first in plain Python (`grow_lists`); it must keep the nodes the torch growth
    (`grow_on_device`, used on GPUs) keeps: the same expected-acceptance curve, a valid tree whose every score is its
    parent's times its key's rate, and the same nodes where no two scores tie."""
    from tr_core.calibration import BIN_OF_STORED_LIST, N_BINS, stored_bin
    from tr_core.growth import grow_lists, grow_on_device

    gen = torch.Generator().manual_seed(budget * 31 + depth)
    drafter = AdaptiveDrafter(torch.device("cpu"))
    drafter.count(list(range(32)), [bool(b) for b in torch.randint(0, 2, (32,), generator=gen)])
    matrix = AdjacencyMatrix(50, k=4)
    matrix.table[:] = torch.randint(0, 50, (50, 4), generator=gen, dtype=torch.int32)
    matrix.filled[:] = True
    matrix.probs[:] = torch.randint(0, 256, (50, 4), generator=gen, dtype=torch.uint8)
    matrix.stamps[:] = torch.randint(0, 6, (50,), generator=gen, dtype=matrix.stamps.dtype)
    drafter.answer_start = 3
    lut = torch.tensor([drafter.rate_host[b] for b in BIN_OF_STORED_LIST], dtype=torch.float32)
    device = grow_on_device(matrix, torch.tensor([7]), lut, 3, budget, depth)
    host = grow_lists(matrix, 7, drafter.rate_host, 3, budget, depth)
    assert host["expected"] == pytest.approx(device.expected.tolist(), rel=1e-5)
    n = len(host["tokens"])
    assert n == device.tokens.shape[0] and host["tokens"][0] == 7 and host["parents"][0] == 0
    for i in range(1, n):
        parent = host["parents"][i]
        assert parent < i and host["depths"][i] == host["depths"][parent] + 1 <= depth
        row, stored = host["tokens"][parent], int(matrix.probs[host["tokens"][parent], host["ranks"][i]])
        assert host["tokens"][i] == int(matrix.table[row, host["ranks"][i]])
        key = host["bins"][i]
        assert key == int(stored_bin(torch.tensor(stored))) + (N_BINS if int(matrix.stamps[row]) < 3 else 0)
        assert host["scores"][i] == pytest.approx(host["scores"][parent] * drafter.rate_host[key])
    scores = sorted(host["scores"])
    if all(b > a * (1 + 1e-6) for a, b in zip(scores, scores[1:])):
        paths = lambda t: sorted(tuple(t["tokens"][j] for j in path_to(t["parents"], i)) for i in range(len(t["tokens"])))
        assert paths(host) == paths({name: getattr(device, name).tolist() for name in ("tokens", "parents")})
    grown = drafter.grow(matrix, torch.tensor([7]), budget, depth)  # the drafter's CPU path is the host one
    assert grown.tokens.tolist() == host["tokens"] and grown.expected.tolist() == pytest.approx(host["expected"])


@pytest.mark.parametrize("size", [0, 1, 3, 8, 20])
def test_host_draft_keeps_the_nodes_the_device_take_keeps(size):
    """On a CPU `draft` takes the first m nodes of the host tree, which `grow_lists` yields best first; they must be
    the m nodes the device path's `take` picks by score from the same tree, in a valid tree of the same shape."""
    from tr_core.growth import grown_tensors

    gen = torch.Generator().manual_seed(size + 5)
    drafter = AdaptiveDrafter(torch.device("cpu"))
    drafter.count(list(range(32)), [bool(b) for b in torch.randint(0, 2, (32,), generator=gen)])
    matrix = AdjacencyMatrix(60, k=4)
    matrix.table[:] = torch.randint(0, 60, (60, 4), generator=gen, dtype=torch.int32)
    matrix.filled[:] = True
    matrix.probs[:] = torch.randint(0, 256, (60, 4), generator=gen, dtype=torch.uint8)
    drafter.next_size = size
    draft = drafter.draft(torch.tensor([7]), matrix)
    tree = drafter.grown  # the tree the draft was taken from, grown now (an answer's first step)
    assert draft.size == size + 1 and draft.tokens[0].item() == 7
    assert draft.extras["node"].tolist() == list(range(size + 1)) and draft.extras["bins"].shape == (size + 1,)
    reference = drafter.take(grown_tensors(tree), size, drafter.max_depth)
    paths = lambda d: sorted(tuple(d.tokens[j].item() for j in path_to(d.parents.tolist(), i)) for i in range(d.size))
    kept_scores = sorted(draft.node_probs.tolist())
    assert kept_scores == pytest.approx(sorted(reference.node_probs.tolist()))
    scores = sorted(tree["scores"])
    if all(b > a * (1 + 1e-6) for a, b in zip(scores, scores[1:])):  # no ties: the very same nodes
        assert paths(draft) == paths(reference)
    parents = draft.parents.tolist()
    assert all(parents[i] < i for i in range(1, draft.size))
    ancestors = [set(path_to(parents, i)) for i in range(draft.size)]
    assert draft.tree_mask.tolist() == [[j in ancestors[i] for j in range(draft.size)] for i in range(draft.size)]


def test_candidates_of_rows_written_before_the_answer_are_calibrated_apart():
    """A row recycled in an earlier answer (another question's context) keys its candidates N_BINS higher, so their
    acceptance is learned apart from rows this answer wrote; the tree ranks them by their own rates."""
    from tr_core.calibration import MATRIX_KEYS, N_BINS, stored_bin

    drafter = AdaptiveDrafter(torch.device("cpu"))
    matrix = AdjacencyMatrix(10, k=2)
    matrix.table[7] = torch.tensor([3, 4]); matrix.probs[7] = torch.tensor([200, 200])
    matrix.table[3] = torch.tensor([5, 6]); matrix.probs[3] = torch.tensor([200, 200])
    matrix.table[4] = torch.tensor([8, 9]); matrix.probs[4] = torch.tensor([200, 200])
    matrix.filled[[7, 3, 4]] = True
    matrix.stamps[7], matrix.stamps[3], matrix.stamps[4] = 12, 12, 4  # 7 and 3 in this answer, 4 before it
    drafter.answer_start = 10
    grown = drafter.grow(matrix, torch.tensor([7]), budget=6, max_depth=2)
    key = {tok: b for tok, b in zip(grown.tokens.tolist(), grown.bins.tolist())}
    fresh = int(stored_bin(torch.tensor(200)))
    assert key[3] == key[4] == key[5] == fresh and key[8] == key[9] == fresh + N_BINS
    # older rows' candidates fail: their rate drops, this answer's rows keep theirs
    before = drafter.rate.clone()
    assert before[fresh + N_BINS] == before[fresh]  # untested, an older row's bin takes this answer's rate
    drafter.count([fresh + N_BINS] * 40, [False] * 40)
    assert drafter.rate[fresh + N_BINS] < 0.1 and drafter.rate[fresh] == before[fresh]
    assert drafter.rate.shape == (MATRIX_KEYS,)
    regrown = drafter.grow(matrix, torch.tensor([7]), budget=6, max_depth=2)
    order = regrown.tokens[torch.argsort(regrown.scores, descending=True)].tolist()
    assert order.index(5) < order.index(8) and order.index(6) < order.index(9)  # same stored p, older ranks lower


def test_the_engine_tells_the_drafter_when_the_answer_began():
    """The second answer's trees meet rows the first answer wrote: those candidates are learned under the older keys."""
    from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

    from tr_core import Engine
    from tr_core.calibration import MATRIX_KEYS, N_BINS

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    cfg = DecodeConfig(template="adaptive-fixed", max_new_tokens=24)
    drafter = engine.drafter_for(cfg)
    older = slice(N_BINS + 1, MATRIX_KEYS)  # older rows' keys above bin 0 (never-written rows: stored p = 0)
    start = drafter.trials[older].sum().item()
    list(engine.generate([11, 12, 13, 14, 15], cfg))
    assert drafter.answer_start == 0 and drafter.trials[older].sum().item() == start
    list(engine.generate([15, 14, 13, 12, 11], cfg))
    assert drafter.answer_start == engine.clock.answer_starts[-1] > 0
    assert drafter.trials[older].sum().item() > start


def test_adaptive_size_choice_follows_the_cost_curve():
    drafter = AdaptiveDrafter(torch.device("cpu"))
    flat = ForwardCost()
    flat.ms = {n: 10.0 for n in flat.ms}  # a GPU-like flat curve: take everything useful
    drafter.cost = flat
    assert drafter.choose_size([0.0, 0.9, 1.7, 2.0, 2.1], budget=4) == 4
    steep = ForwardCost()
    steep.ms = {n: 10.0 * n for n in steep.ms}  # cost linear in tokens: drafting never pays
    drafter.cost = steep
    assert drafter.choose_size([0.0, 0.9, 1.7, 2.0, 2.1], budget=4) == 0


def test_tree_from_parents_requires_bfs_order():
    with pytest.raises(ValueError, match="BFS-ordered"):
        tree_from_parents("bad", [-1, 2, 0], [-1, 0, 0])
    with pytest.raises(ValueError, match="sorted by depth"):
        tree_from_parents("bad", [-1, 0, 1, 0], [-1, 0, 0, 1])


def test_grown_trees_ancestor_mask_equals_the_static_builders_on_random_trees():
    import random

    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 40)
        parents = [-1]
        for i in range(1, n):  # BFS order: a parent at depth d only after all of depth d - 1
            parents.append(rng.randint(max(0, parents[-1]), i - 1))
        try:
            ref = tree_from_parents("r", parents, [-1] + [0] * (n - 1))
        except ValueError:
            continue
        grown = ancestor_mask(torch.tensor([max(p, 0) for p in parents]), max_depth=max(ref.depths_list) + 1)
        assert torch.equal(grown, ref.tree_mask)


def test_prompt_seeding_puts_the_prompt_successor_first():
    m = AdjacencyMatrix(vocab_size=10, k=3)
    m.update(torch.tensor([4]), torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 2.0, 1.0, 0.0, 0.0]]))  # row 4: 5, 6, 7
    changed = m.seed_from_text([4, 6, 2, 4, 8])  # successors: 4 -> 6 then 4 -> 8 (the last occurrence wins), 6 -> 2, 2 -> 4
    assert changed == 3
    assert m.table[4].tolist() == [8, 5, 6]  # seeded first, the old candidates shift right
    assert m.table[6].tolist()[0] == 2 and m.table[2].tolist()[0] == 4
    assert m.get_probs()[4, 0].item() == pytest.approx(0.5, abs=0.01)
    probs = m.get_probs()[4].tolist()  # the kept candidates share the other half: still sorted, summing to <= 1
    assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
    assert probs[1] == pytest.approx(0.5 * torch.softmax(torch.tensor([0.0] * 5 + [3.0, 2.0, 1.0, 0.0, 0.0]), 0)[5].item(), abs=0.01)
    m.seed_from_text([4, 5])  # a candidate already in the row moves to the front instead of repeating
    assert m.table[4].tolist() == [5, 8, 6]


def test_no_example_question_is_one_the_warm_start_already_answered():
    """The warm start's library holds its corpus answers, which the hybrid copies from: an example close to a corpus
    prompt (the Code example once was, word for word but its last clause) would show a speedup no new question gets.
    Word sets of each example against every corpus prompt: Jaccard similarity under 0.5."""
    import json
    import re
    from pathlib import Path

    from studio.texts import EXAMPLES

    root = Path(__file__).resolve().parents[1]
    corpus = [json.loads(line)["prompt"] for line in (root / "tr_core/warm_start/corpus.jsonl").open()]

    def words(text: str) -> set[str]:
        return set(re.findall(r"[a-z]+", text.lower()))

    for name, question in EXAMPLES:
        for prompt in corpus:
            a, b = words(question), words(prompt)
            assert len(a & b) / len(a | b) < 0.5, (name, prompt)
