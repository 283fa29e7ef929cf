"""Adaptive, hardware-aware draft trees: grown best-first over the matrix by calibrated acceptance rates, sized each
step to maximise expected tokens per second on this device. The next step's tree is grown right after verification
(`lookahead`): on a GPU on the device, riding the step's one sync; on a CPU in plain Python (docs/cpu-policy.md)."""
from __future__ import annotations

from collections import deque

import torch

from .calibration import BIN_OF_STORED_LIST, MATRIX_KEYS, N_BINS, matrix_prior, tested_candidates
from .config import DecodeConfig
from .cost import ForwardCost
from .drafters import Draft, DraftContext, Drafter, NoDraft, StepResult
from .growth import (DRAFTED, GROWN, GrownTree, ancestor_mask, grow_lists, grow_on_device, grown_tensors, host_draft,
                     root_alone)
from .kernels import plan_of, timed_costs
from .matrix import AdjacencyMatrix
from .tree import ADAPTIVE, SIZED_BY_COST
from .trust import HindsightTrust, size_class

DRAFT_MARGIN = 1.03  # draft only where the predicted rate beats a plain step by 3% (estimates are noisy; ties lose)


def sized_by_cost(cfg: DecodeConfig) -> bool:
    """Whether the tree is sized by measured cost (`adaptive`, `hybrid`), not always the full budget (`*-fixed`)."""
    return cfg.hardware_aware and cfg.template in SIZED_BY_COST


class AdaptiveDrafter(Drafter):
    """Grows best-first trees, picks their size from the cost model, and learns its calibration online."""
    recycles = True
    seeds_prompt = True  # answers that copy their prompt draft from it (README: +8% accepted at 80 nodes)

    def __init__(self, device: torch.device, prior: float = 4.0, on_host: bool | None = None):
        self.device = device
        self.on_host = device.type == "cpu" if on_host is None else on_host  # grown in plain Python (tests: False)
        self.cost = ForwardCost()
        self.budget, self.max_depth, self.sized_by_cost = 80, 8, True  # this answer's settings (see begin)
        self.matrix_depth = self.max_depth  # levels grown over the matrix (the hybrid's retrieved runs go deeper)
        self.prior = prior  # pseudo-trials behind every starting rate (`_rate`)
        self.hits, self.trials = matrix_prior(prior)  # acceptance counts per calibration key
        self._refresh()
        self.pending: GrownTree | None = None  # on a GPU, the tree grown for the next step, from the bonus token
        self.grown: dict[str, list] | None = None  # on a CPU, the same as host lists (`grow_lists`)
        self.next_size = 0  # draft nodes for the next step (an answer's first step drafts none)
        self.expected_next: list[float] | None = None  # the next tree's expected-acceptance curve (host)
        self.host_tree: dict[str, list] | None = None  # the pending tree's shape and scores on the host, for learning
        self.host_live = 0  # on a GPU, the pending tree's nodes under written rows (score > 0): the most it may draft
        self.trust = HindsightTrust()
        self.answer_start = -1  # the matrix clock when this answer began (rows stamped before it are older)
        self.replayed: deque[int] | None = None  # sizes to draft instead of choosing them (`replay_sizes`)

    def _rate(self, key: int, hits: list[float], trials: list[float]) -> float:
        """Acceptance rate of one key; an older row's bin leans on this answer's same bin with `prior` pseudo-trials."""
        if N_BINS <= key < MATRIX_KEYS:
            rate = (hits[key] + self.prior * self.rate_host[key - N_BINS]) / (trials[key] + self.prior)
        else:
            rate = hits[key] / max(trials[key], 1e-9)
        return min(max(rate, 1e-3), 0.98)

    def _refresh(self, keys: set[int] | None = None) -> None:
        """Recompute `rate_host` for `keys` (None: all) and the older bins leaning on them; on a GPU, `rate_lut` too."""
        hits, trials = self.hits.numpy(), self.trials.numpy()
        if keys is None:
            self.rate_host = [0.0] * len(hits)
            keys = set(range(len(hits)))
        keys |= {key + N_BINS for key in keys if key < N_BINS}
        for key in sorted(keys):  # this answer's bins before the older ones that lean on them
            self.rate_host[key] = self._rate(key, hits, trials)
        if not self.on_host:
            self.rate_lut = torch.tensor([self.rate_host[key] for key in BIN_OF_STORED_LIST], dtype=torch.float32,
                                         device=self.device)

    def learned(self) -> dict:
        """What holds on any machine: calibration counts {"hits", "trials"} [keys] float64 and the trust state."""
        return {"hits": self.hits.clone(), "trials": self.trials.clone(), "trust": self.trust.state()}

    def drop_older_row_calibration(self) -> None:
        """Forget the older-row keys' counts (they lean on this answer's bins again; warm_build.calibrate)."""
        self.hits[N_BINS:MATRIX_KEYS] = 0.0
        self.trials[N_BINS:MATRIX_KEYS] = 0.0
        self._refresh()

    def take_learned(self, learned: dict) -> None:
        """Start from `learned` (a `learned()` of this kind); ValueError, changing nothing, when it does not fit."""
        hits, trials = learned.get("hits"), learned.get("trials")
        if not (isinstance(hits, torch.Tensor) and isinstance(trials, torch.Tensor)) or \
                hits.shape != self.hits.shape or trials.shape != self.trials.shape:
            raise ValueError(f"calibration counts of {self.hits.shape[0]} keys expected")
        hits, trials = hits.double(), trials.double()
        if not (torch.isfinite(hits).all() and torch.isfinite(trials).all() and (hits >= 0).all()
                and (hits <= trials + 1e-6).all()):
            raise ValueError("calibration counts must be finite, with 0 <= hits <= trials")
        trust = HindsightTrust(self.trust.decay)
        trust.load_state(learned.get("trust"))
        self.hits, self.trials, self.trust = hits.clone(), trials.clone(), trust
        self._refresh()

    @property
    def rate(self) -> torch.Tensor:
        """The acceptance rate per calibration key, as a float32 tensor (a copy)."""
        return torch.tensor(self.rate_host, dtype=torch.float32)

    def times_forwards(self, cfg: DecodeConfig) -> bool:
        """True when sized by cost and this device's forwards were never timed (`begin` probes them)."""
        return sized_by_cost(cfg) and not self.cost.measured

    def begin(self, ctx: DraftContext) -> None:
        """Take the answer's settings; time this device's forwards once per model (the kernel tuning's timings
        reused)."""
        cfg = ctx.cfg
        self.pending, self.grown, self.host_tree = None, None, None
        self.trust.start_answer()
        self.answer_start = ctx.answer_start
        self.budget, self.max_depth = cfg.node_budget, cfg.max_depth
        self.matrix_depth = cfg.max_depth
        self.sized_by_cost = sized_by_cost(cfg)
        if self.times_forwards(cfg):
            plan = plan_of(ctx.runner.model)
            self.cost.probe_once(ctx.runner, ctx.prompt, max_tokens=cfg.node_budget + 1,
                                 known=timed_costs(ctx.runner.model), variant=plan is not None and plan.exact is not None)
        self.next_size = 0  # an answer's first step verifies the root alone (docs/cpu-policy.md)

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The best `next_size` nodes (the full budget when not sized by cost) of the tree grown from `root`."""
        first = (self.grown if self.on_host else self.pending) is None
        if first:  # no look-ahead yet, so no host-known curve
            self.expected_next = None
            if self.on_host:
                self.grown = self.grow_lists(matrix, int(root), *self.growth())
            else:
                self.pending = self.grow(matrix, root, *self.growth())
                # a fixed tree drafts all its nodes under written rows: counting them costs this step a sync
                self.host_live = 0 if self.sized_by_cost else int((self.pending.scores > 0).sum()) - 1
        if self.on_host:  # grown best first: the best m nodes are the first m
            tree, live = self.grown, len(self.grown["tokens"]) - 1
            expected, order = tree["expected"], list(range(1, live + 1))
        else:  # the pending tree is known on the host on every step but an answer's first
            tree, live, expected, order = self.host_tree, self.host_live, self.expected_next, []
            if tree is not None:
                order = sorted(range(1, len(tree["scores"])), key=lambda i: (-tree["scores"][i], i))
        if self.host_tree is not None:
            self.trust.watch(tree["tokens"], tree["parents"], order, self.expected_next)
        size = min(self.batch_size(self.next_size if self.sized_by_cost else self.budget), live)
        if size == 0:
            why = self.why_not(first, expected or [0.0], tree, order)
            return root_alone(ADAPTIVE, root if self.on_host else self.pending.tokens[:1], self.max_depth + 1,
                              extras=("bins", "node"), no_draft=why)
        if not self.on_host:
            return self.take(self.pending, size, self.max_depth)
        return host_draft(ADAPTIVE, {name: tree[name][: size + 1] for name in DRAFTED}, self.max_depth + 1,
                          root.device, extras={"node": list(range(size + 1))})

    def lookahead(self, bonus: torch.Tensor, matrix: AdjacencyMatrix) -> dict[str, torch.Tensor]:
        """Grow the next step's tree from the bonus token: on a CPU as host lists, on a GPU on the device."""
        budget, depth = self.growth()
        if self.on_host:
            self.grown = self.grow_lists(matrix, int(bonus), budget, depth)
            return {}
        return self.lookahead_on_device(bonus, matrix, budget, depth)

    def lookahead_on_device(self, bonus: torch.Tensor, matrix: AdjacencyMatrix, budget: int,
                            depth: int) -> dict[str, torch.Tensor]:
        """The next tree grown on the device; returns the tensors the host needs of it, for the sync."""
        self.pending = self.grow(matrix, bonus, budget, depth)
        return {"expected": self.pending.expected, "grown.scores": self.pending.scores,
                **{f"grown.{name}": getattr(self.pending, name) for name in GROWN}}

    def growth(self) -> tuple[int, int]:
        """(nodes, levels) of the next tree: the full budget for fixed trees, else about twice the last size."""
        if not self.sized_by_cost:
            return self.budget, self.matrix_depth
        m = self.next_size
        return min(self.budget, 2 * m + 8), min(self.matrix_depth, m + 3)

    def observe(self, result: StepResult) -> None:
        """Learn from the step; choose the next step's size."""
        self.learn_step(result)
        if self.on_host and self.grown is not None:  # the next tree, grown by `lookahead`
            self.host_tree, self.expected_next = self.grown, self.grown["expected"]
        elif not self.on_host and "expected" in result.extras:
            self.expected_next = result.extras["expected"]
            self.host_tree = {name: [int(v) for v in result.extras[f"grown.{name}"]] for name in GROWN}
            self.host_tree["scores"] = result.extras["grown.scores"]
            self.host_live = sum(score > 0 for score in self.host_tree["scores"][1:])
        else:
            return
        self.next_size = self.choose_size(self.expected_next, self.budget)

    def learn_step(self, result: StepResult) -> None:
        """What every verified step teaches: per-bin calibration, the trust factor, the cost of the step."""
        self.learn_verified(result)
        self.trust.extend(result.emitted)
        if result.forwarded:
            self.cost.observe(result.forward_tokens, result.step_ms)

    def grow(self, matrix: AdjacencyMatrix, root: torch.Tensor, budget: int, max_depth: int) -> GrownTree:
        """Best-first tree of up to `budget` draft nodes under `root` ([1] long)."""
        if self.on_host:
            return grown_tensors(self.grow_lists(matrix, int(root.view(-1)[0]), budget, max_depth))
        return grow_on_device(matrix, root, self.rate_lut, self.answer_start, budget, max_depth)

    def grow_lists(self, matrix: AdjacencyMatrix, root: int, budget: int, max_depth: int) -> dict[str, list]:
        return grow_lists(matrix, root, self.rate_host, self.answer_start, budget, max_depth)

    def batch_size(self, alone: int) -> int:
        """The size chosen for this answer alone, unless a batch set `cap` (its forward pays for that many anyway)."""
        return alone if self.cap is None else self.cap

    def next_curve(self) -> list[float] | None:
        """The next tree's trusted expected-acceptance curve; None when not sized by cost, or on a first step."""
        if not self.sized_by_cost or self.expected_next is None:
            return None
        return self.trusted(self.expected_next)

    def trusted(self, expected: list[float]) -> list[float]:
        return [0.0] + [self.trust[size_class(m)] * expected[m] for m in range(1, len(expected))]

    def choose_size(self, expected: list[float], budget: int) -> int:
        """The size `size_choice` picks (0: a plain step), or while replaying (`replay_sizes`) the next recorded one."""
        if self.replayed:
            return min(self.replayed.popleft(), budget, len(expected) - 1)
        return self.size_choice(expected, budget)[0]

    def replay_sizes(self, sizes: list[int]) -> None:
        """Draft these sizes (per step, from the second on) instead of choosing them, so the speed meter's re-decode
        drafts the recorded answer's very trees; choosing resumes when they run out."""
        self.replayed = deque(sizes)

    def size_choice(self, expected: list[float], budget: int) -> tuple[int, int]:
        """(argmax over m of (trust(m) * expected[m] + 1) / t(m + 1), 0 unless it beats a plain step by DRAFT_MARGIN;
        the best m >= 1: 0 when the tree has no nodes)."""
        best_m, best_rate, top_m, top_rate = 0, DRAFT_MARGIN / self.cost(1), 0, 0.0
        for m in range(1, min(budget, len(expected) - 1) + 1):
            rate = (self.trust[size_class(m)] * expected[m] + 1.0) / self.cost(m + 1)
            if rate > best_rate:
                best_m, best_rate = m, rate
            if rate > top_rate:
                top_m, top_rate = m, rate
        return best_m, top_m

    def why_not(self, first: bool, expected: list[float], tree: dict[str, list] | None, order: list[int],
                context: bool = False) -> NoDraft:
        """Why a step drafts nothing, with the best `tree` considered (None: not on the host), `order`: best first."""
        if first and self.sized_by_cost:
            return NoDraft("first step", context=context)
        m = self.size_choice(expected, self.budget)[1] if tree is not None else 0
        if m == 0:
            return NoDraft("empty row", context=context)
        keep = [0, *sorted(order[:m])]
        new = {old: i for i, old in enumerate(keep)}
        return NoDraft("cost", gain=self.trust[size_class(m)] * expected[m],
                       cost_ratio=self.cost(m + 1) / self.cost(1), tokens=tuple(tree["tokens"][i] for i in keep),
                       parents=(-1, *(new[tree["parents"][i]] for i in keep[1:])),
                       expected=tuple(round(float(tree["scores"][i]), 4) for i in keep), context=context)

    @staticmethod
    def take(grown: GrownTree, m: int, max_depth: int) -> Draft:
        """The tree of the best m nodes by score, as a Draft on the device (tokens [m+1]). No sync."""
        device = grown.tokens.device
        if m == 0:
            return root_alone(ADAPTIVE, grown.tokens[:1], max_depth + 1, extras=("bins", "node"))
        best = torch.topk(grown.scores[1:], m).indices + 1
        keep = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.sort(best).values])  # parents first
        remap = torch.zeros(grown.tokens.shape[0], dtype=torch.long, device=device)
        remap[keep] = torch.arange(m + 1, device=device)
        parents = remap[grown.parents[keep]]
        return Draft(name=ADAPTIVE, tokens=grown.tokens[keep], parents=parents, depths=grown.depths[keep],
                     ranks=grown.ranks[keep], tree_mask=ancestor_mask(parents, max_depth), size=m + 1,
                     levels=max_depth + 1, node_probs=grown.scores[keep],
                     extras={"bins": grown.bins[keep], "node": keep})

    def learn_verified(self, result: StepResult) -> None:
        """Learn from the whole grown tree when its host copy is known (`tested_candidates`), else the drafted nodes."""
        tree, nodes = self.host_tree, result.extras.get("node")
        if tree is None or nodes is None or len(nodes) != len(result.parents):
            return self.learn(result.parents, [int(b) for b in result.extras["bins"]], result.accepted)
        self.count(*tested_candidates(tree["tokens"], tree["parents"], tree["depths"], tree["bins"],
                                      [int(n) for n in nodes], result.accepted, result.emitted))

    def count(self, keys: list[int], hits: list[bool]) -> None:
        """Add tested candidates (their calibration keys, and whether each was accepted) to the rates."""
        if keys:
            trials, passed = self.trials.numpy(), self.hits.numpy()  # views: a few keys a step, no torch call
            for key, hit in zip(keys, hits):
                trials[key] += 1.0
                passed[key] += hit
            self._refresh(set(keys))

    def learn(self, parents: list[int], bins: list[int], accepted: list[int]) -> None:
        """Learn from one verified tree: a node whose parent was accepted was tested; did the model agree?"""
        on_path = set(accepted)
        tested = [node for node in range(1, len(parents)) if parents[node] in on_path]
        self.count([bins[node] for node in tested], [node in on_path for node in tested])
