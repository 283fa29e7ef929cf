"""Hybrid drafting: the adaptive matrix tree (adaptive.py) with the continuations the context index retrieves
(context.py) walked into it; a node scores the product of its path's acceptance rates, learned online per key (matrix
bin and row age; match length, contested or shared), and the best nodes form the draft, sized as `adaptive`'s."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .adaptive import AdaptiveDrafter
from .calibration import MATRIX_KEYS, matrix_prior, tested_candidates
from .growth import GROWN, host_draft, root_alone
from .context import ANSWER, EARLIER_ANSWER, EARLIER_PROMPT, LIBRARY, MAX_MATCH, PROMPT, ContextIndex, Library, Match
from .drafters import Draft, DraftContext, StepResult
from .matrix import AdjacencyMatrix
from .tree import HYBRID

RETRIEVAL_DEPTH = 16  # longest run copied from the context in one draft (PLD's default is 10)
MAX_MATCHES = 3  # retrieved continuations per step, one per distinct next token
LIBRARY_MATCHES = 1  # ... and at most this many more from the warm start's answers (`HybridDrafter.library`)
# Calibration keys: the matrix's (MATRIX_KEYS), then retrieved runs by match length: context-only uncontested, then
# contested, then shared with the matrix; the same three blocks again for runs found outside this conversation
CTX_KEY = MATRIX_KEYS
CONTESTED_KEY = MATRIX_KEYS + MAX_MATCH
BOTH_KEY = MATRIX_KEYS + 2 * MAX_MATCH
EARLIER = 3 * MAX_MATCH
N_KEYS = MATRIX_KEYS + 6 * MAX_MATCH
EARLIER_WEIGHT = 0.4  # prior rates of runs from outside this conversation, relative to this conversation's
_GROWN = (*GROWN, "ranks")  # the matrix tree's fields synced for the merge (and its scores)


def context_key(match_len: int, shared: bool, contested: bool = False, earlier: bool = False) -> int:
    """The calibration key of a retrieved candidate extending a match of `match_len` tokens (`earlier`: elsewhere)."""
    base = BOTH_KEY if shared else CONTESTED_KEY if contested else CTX_KEY
    return base + (EARLIER if earlier else 0) + min(max(match_len, 1), MAX_MATCH) - 1


def _prior_counts(prior: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting (hits, trials) [N_KEYS], `prior` trials each, at the rates the development run measured (bench/README):
    a retrieved run is right more often the longer its match; runs from outside this conversation at EARLIER_WEIGHT."""
    gap = torch.arange(MAX_MATCH, dtype=torch.float64)  # match length - 1
    uncontested = 0.12 + 0.83 * (1 - torch.exp(-gap / 3.5))
    contested = 0.03 + 0.87 * (1 - torch.exp(-gap / 6))
    both = 0.25 + 0.65 * (1 - torch.exp(-gap / 2.5))
    hits, trials = matrix_prior(prior)
    retrieved = torch.cat([uncontested, contested, both])
    retrieved = torch.cat([retrieved, retrieved * EARLIER_WEIGHT])
    return torch.cat([hits, retrieved * prior]), torch.cat([trials, torch.full_like(retrieved, prior)])


@dataclass
class Plan:
    """The merged candidate tree on the host, parents before children."""
    tokens: list[int]
    parents: list[int]  # root: 0
    depths: list[int]
    ranks: list[int]  # matrix rank, or k + i for the i-th context-only child of a node
    keys: list[int]  # calibration key of every node (root: 0)
    sources: list[str]  # "root", "matrix", "context" or "both"
    origins: list[dict | None]  # where a retrieved node was copied from (Match.origin; None for matrix nodes)
    scores: list[float]  # estimated probability that each node is accepted (root: 1)

    def ranked(self) -> list[int]:
        """The draft nodes best first (ties: lower index first, so a parent precedes its children)."""
        return sorted(range(1, len(self.tokens)), key=lambda i: (-self.scores[i], i))

    def best(self, m: int, ranked: list[int] | None = None) -> list[int]:
        """The root and the best m nodes by score, in index order (so parents come first)."""
        return [0, *sorted((ranked if ranked is not None else self.ranked())[:m])]

    def expected(self, ranked: list[int]) -> list[float]:
        """Expected accepted draft tokens using the best m nodes, m = 0..len - 1."""
        return list(itertools.accumulate((self.scores[i] for i in ranked), initial=0.0))


class HybridDrafter(AdaptiveDrafter):
    """The adaptive matrix tree merged with continuations retrieved from the context index."""

    def __init__(self, device: torch.device, prior: float = 4.0, on_host: bool | None = None) -> None:
        super().__init__(device, prior, on_host)
        self.hits, self.trials = _prior_counts(prior)
        self._refresh()
        self.index = ContextIndex()
        self.library: Library | None = None  # the warm start's answers (tr_core.warm), searched too
        self.plan: Plan | None = None  # the next step's merged tree
        self.kept: list[int] = []  # the plan nodes drafted this step (root first, in draft order)
        self.name = HYBRID
        self.k = 8
        self._answering = False  # emitted tokens of this answer are being indexed

    def forget_context(self) -> None:
        """Forget every conversation it indexed and the warm start's answers (its calibration stays)."""
        self.index.clear()
        self.library = None

    def begin(self, ctx: DraftContext) -> None:
        """Take the settings and index the prompt (earlier prompts and answers stay, relabelled)."""
        super().begin(ctx)
        self.name, self.k = ctx.cfg.template, ctx.matrix.k
        self.max_depth = max(ctx.cfg.max_depth, RETRIEVAL_DEPTH)
        self.index.relabel(PROMPT, EARLIER_PROMPT)
        self.index.relabel(ANSWER, EARLIER_ANSWER)
        self.index.start_segment(PROMPT)
        self.index.extend(ctx.prompt)
        self.plan, self.grown, self._answering = None, None, False

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The best nodes of the merged tree (grown now on an answer's first step, which drafts nothing when sized by
        cost, as `adaptive`'s: drafts off the chat template's last token mostly failed, README item 8)."""
        first = self.plan is None
        if first:  # the matrix tree as host lists (on a GPU: with a sync)
            if self.on_host:
                grown = self.grow_lists(matrix, int(root), self.budget, self.matrix_depth)
            else:
                tree = self.grow(matrix, root, self.budget, self.matrix_depth)
                grown = live_part({name: getattr(tree, name).tolist() for name in (*_GROWN, "scores")})
            self.plan = self.merge(grown, self.lookup())
        ranked = self.plan.ranked()  # sorted once: the size choice and the draft read the same order
        curve = self.plan.expected(ranked)
        if self.sized_by_cost:
            size = 0 if first else self.batch_size(self.choose_size(curve, self.budget))
        else:
            size = min(self.budget, len(curve) - 1)
        self.next_size = size
        self.trust.watch(self.plan.tokens, self.plan.parents, ranked, curve)
        self.kept = self.plan.best(min(size, len(self.plan.tokens) - 1), ranked)
        if len(self.kept) == 1:
            why = self.why_not(first, curve, vars(self.plan), ranked, context=True)
            return root_alone(self.name, root, self.max_depth + 1, sources=("root",), origins=(None,), no_draft=why)
        return self.take_plan(self.plan, self.kept, root)

    def lookahead_on_device(self, bonus: torch.Tensor, matrix: AdjacencyMatrix, budget: int,
                            depth: int) -> dict[str, torch.Tensor]:
        """On a GPU the next matrix tree rides the step's sync, to be merged on the host in `observe`."""
        grown = self.grow(matrix, bonus, budget, depth)
        return {f"grown.{name}": getattr(grown, name) for name in (*_GROWN, "scores")}

    def observe(self, result: StepResult) -> None:
        """Learn calibration, trust and cost; index the emitted tokens; merge the next step's tree."""
        self.learn_step(result)
        if not self._answering:
            self.index.start_segment(ANSWER)
            self._answering = True
        self.index.extend(result.emitted)
        self.plan, grown, self.grown = None, self.grown, None
        if "grown.tokens" in result.extras:
            grown = {name: [int(v) for v in result.extras[f"grown.{name}"]] for name in _GROWN}
            grown = live_part({**grown, "scores": result.extras["grown.scores"]})
        if grown is not None:
            self.plan = self.merge(grown, self.lookup())

    def next_curve(self) -> list[float] | None:
        """The merged plan's trusted expected-acceptance curve (None: not sized by cost, or an answer's first step)."""
        if not self.sized_by_cost or self.plan is None:
            return None
        return self.trusted(self.plan.expected(self.plan.ranked()))

    def lookup(self) -> list[Match]:
        """The suffix's continuations in the conversation (MAX_MATCHES), then in the warm start's answers
        (LIBRARY_MATCHES more, each with a next token not found already; rated as an earlier conversation's)."""
        found = self.index.lookup(MAX_MATCHES, RETRIEVAL_DEPTH)
        if self.library is None:
            return found
        suffix = self.index.stream[-MAX_MATCH:]
        return found + self.library.continuations(suffix, LIBRARY_MATCHES, RETRIEVAL_DEPTH,
                                                  {m.tokens[0] for m in found if m.tokens})

    def learn_verified(self, result: StepResult) -> None:
        """Calibrate on the whole plan, not only its drafted part (calibration.tested_candidates)."""
        plan, kept = self.plan, self.kept
        if plan is None or len(kept) != len(result.parents):
            return self.learn(result.parents, [int(b) for b in result.extras["bins"]], result.accepted)
        self.count(*tested_candidates(plan.tokens, plan.parents, plan.depths, plan.keys, kept, result.accepted,
                                      result.emitted))

    def merge(self, grown: dict[str, list[int]], matches: list[Match]) -> Plan:
        """The matrix tree with every retrieved continuation walked into it (shared where the tokens agree)."""
        n = len(grown["tokens"])
        plan = Plan(tokens=list(grown["tokens"]), parents=list(grown["parents"]), depths=list(grown["depths"]),
                    ranks=list(grown["ranks"]), keys=[0, *grown["bins"][1:]], sources=["root"] + ["matrix"] * (n - 1),
                    origins=[None] * n, scores=[1.0])
        child = {(plan.parents[i], plan.tokens[i]): i for i in range(1, n)}
        extra: dict[int, int] = {}  # context-only children per node so far
        for match in matches:
            node, earlier = 0, match.where in (EARLIER_PROMPT, EARLIER_ANSWER, LIBRARY)
            for j, token in enumerate(match.tokens[: self.max_depth]):
                length = match.match_len + j
                hit = child.get((node, token))
                if hit is None:
                    hit = child[(node, token)] = len(plan.tokens)
                    extra[node] = extra.get(node, 0) + 1
                    plan.tokens.append(token)
                    plan.parents.append(node)
                    plan.depths.append(plan.depths[node] + 1)
                    plan.ranks.append(self.k + extra[node] - 1)
                    plan.keys.append(context_key(length, shared=False, contested=match.contested, earlier=earlier))
                    plan.sources.append("context")
                    plan.origins.append(match.origin(j + 1))
                elif plan.sources[hit] == "matrix":
                    plan.keys[hit] = context_key(length, shared=True, earlier=earlier)
                    plan.sources[hit] = "both"
                    plan.origins[hit] = match.origin(j + 1)
                node = hit
        for i in range(1, len(plan.tokens)):
            plan.scores.append(plan.scores[plan.parents[i]] * self.rate_host[plan.keys[i]])
        return plan

    def take_plan(self, plan: Plan, keep: list[int], root: torch.Tensor | None = None) -> Draft:
        """The plan's nodes `keep` (root first, parents before children) as a Draft; `root`: its token, if known."""
        if len(keep) == 1 and root is not None:  # a zero-draft step (most steps of an answer that accepts little)
            return root_alone(self.name, root, self.max_depth + 1, sources=("root",), origins=(None,))
        remap = {old: new for new, old in enumerate(keep)}
        nodes = {name: [getattr(plan, name)[i] for i in keep] for name in ("tokens", "depths", "ranks", "scores")}
        nodes.update(parents=[remap[plan.parents[i]] if i else 0 for i in keep], bins=[plan.keys[i] for i in keep])
        return host_draft(self.name, nodes, self.max_depth + 1, self.device,
                          sources=tuple(plan.sources[i] for i in keep), origins=tuple(plan.origins[i] for i in keep))


def live_part(grown: dict[str, list]) -> dict[str, list]:
    """A device-grown matrix tree without the nodes under unwritten rows (score 0), as `grow_lists` grows it."""
    keep = [i for i, score in enumerate(grown["scores"]) if i == 0 or score > 0]
    if len(keep) == len(grown["scores"]):
        return grown
    new = {old: i for i, old in enumerate(keep)}
    out = {name: [values[i] for i in keep] for name, values in grown.items()}
    out["parents"] = [new[grown["parents"][i]] if i else 0 for i in keep]
    return out


__all__ = ["HybridDrafter", "Plan", "context_key", "live_part"]
