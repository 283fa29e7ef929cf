"""Hybrid drafting: one best-first tree whose candidates come from the adjacency matrix AND the context index
(context.py: whole runs the answer may be copying from its prompt, an earlier turn or itself). Each step:

1. the matrix tree is grown best-first from the bonus token (adaptive.py): on a GPU riding the step's one host sync,
   on a CPU in plain Python (`adaptive.grow_lists`);
2. the index takes the emitted tokens and is searched for continuations of the suffix (`ContextIndex.lookup`), each
   walked down the matrix tree: a node is shared where the matrix proposes the same token, added elsewhere;
3. a node's score is the product along its path of acceptance probabilities learned online per key: matrix
   candidates by stored probability (16 bins) and row age, retrieved ones by match length and whether the matched
   n-gram was contested, shared ones by match length, runs of an earlier conversation apart; every candidate under
   an accepted parent counts, drafted or not;
4. the best nodes form the draft, sized by the measured forward cost (`hybrid`) or at the full budget (`hybrid-fixed`).
"""
from __future__ import annotations

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
# Calibration keys: matrix bins 0..31 (adaptive.MATRIX_KEYS: this answer's rows, then older ones); context-only by
# match length, uncontested then contested; shared by length
CTX_KEY = MATRIX_KEYS
CONTESTED_KEY = MATRIX_KEYS + MAX_MATCH
BOTH_KEY = MATRIX_KEYS + 2 * MAX_MATCH
# ... and the same three blocks again for runs found in an earlier conversation (an earlier question's prompt or
# answer), which are right far less often than runs of this conversation's own prompt or answer
EARLIER = 3 * MAX_MATCH
N_KEYS = MATRIX_KEYS + 6 * MAX_MATCH
EARLIER_WEIGHT = 0.4  # prior rates of an earlier conversation's runs, relative to this conversation's
_GROWN = (*GROWN, "ranks")  # the matrix tree's fields synced for the merge


def context_key(match_len: int, shared: bool, contested: bool = False, earlier: bool = False) -> int:
    """The calibration key of a retrieved candidate extending a match of `match_len` tokens (`contested`: the
    matched n-gram had other continuations too; shared candidates are keyed by length alone; `earlier`: the run
    was found in an earlier conversation)."""
    base = BOTH_KEY if shared else CONTESTED_KEY if contested else CTX_KEY
    return base + (EARLIER if earlier else 0) + min(max(match_len, 1), MAX_MATCH) - 1


def is_earlier(match: Match) -> bool:
    """Whether a match lies outside this conversation: in an earlier one, or in the warm start's answers."""
    return match.where in (EARLIER_PROMPT, EARLIER_ANSWER, LIBRARY)


def _prior_counts(prior: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting (hits, trials) [N_KEYS], each of `prior` trials: the matrix keys as `adaptive`'s; retrieved runs'
    rates rise with match length as the development run measured (bench/README). A continuation of a contested
    n-gram is right about 3% of the time after a 1-token match, 40% after 4, 85% after 8+; an uncontested one 15%,
    70%, 85%; one the matrix proposes too 25%, 70%, 80-95%. An earlier conversation's runs start at EARLIER_WEIGHT
    of these (development questions, 2026-12-02: a 2-token match's top run agreed for 3.3 tokens in this prompt,
    1.6 in this answer, 0.1-0.2 in an earlier one). All are then learned online."""
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

    def expected(self, ranked: list[int] | None = None) -> list[float]:
        """Expected accepted draft tokens using the best m nodes, m = 0..len - 1."""
        out = [0.0]
        for i in ranked if ranked is not None else self.ranked():
            out.append(out[-1] + self.scores[i])
        return out


class HybridDrafter(AdaptiveDrafter):
    """The adaptive matrix tree merged with continuations retrieved from the context index."""

    seeds_prompt = True

    def __init__(self, device: torch.device, prior: float = 4.0, on_host: bool | None = None) -> None:
        super().__init__(device, prior, on_host)
        self.hits, self.trials = _prior_counts(prior)
        self._refresh()
        self.index = ContextIndex()
        # the warm start's own answers (tr_core.warm), searched for the conversation's suffix too; None: no warm start
        self.library: Library | None = None
        self.plan: Plan | None = None  # the next step's merged tree
        self.kept: list[int] = []  # the plan nodes drafted this step (root first, in draft order)
        self.name = HYBRID
        self.k = 8
        self._answering = False  # emitted tokens of this answer are being indexed

    def forget_context(self) -> None:
        """Forget every conversation it indexed and the warm start's answers (its calibration stays)."""
        self.index.clear()
        self.library = None

    # -- the drafter seam -------------------------------------------------------------------------------------
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
        """The best nodes of the merged tree (grown now on the first step of an answer).

        Sized by cost, an answer's first step verifies the root alone, as `adaptive`'s does: its tree hangs off the
        chat template's last token, and drafts there mostly failed (README, item 8). The whole first plan still
        teaches the calibration."""
        first = self.plan is None
        if first:
            self.plan = self.merge(self.grow_host(matrix, root, self.budget, self.matrix_depth), self.lookup())
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
            why = self.why_not(first, curve, {"tokens": self.plan.tokens, "parents": self.plan.parents},
                               self.plan.scores, ranked, context=True)
            return root_alone(self.name, root, self.max_depth + 1, sources=("root",), origins=(None,), no_draft=why)
        return self.take_plan(self.plan, self.kept, root)

    def grow_host(self, matrix: AdjacencyMatrix, root: torch.Tensor, budget: int, depth: int) -> dict[str, list]:
        """The matrix tree grown from `root` ([1] long) as host lists, now (on a GPU: with a sync)."""
        if self.on_host:
            return self.grow_lists(matrix, int(root), budget, depth)
        grown = self.grow(matrix, root, budget, depth)
        return live_part({name: getattr(grown, name).tolist() for name in (*_GROWN, "scores")})

    def lookahead_on_device(self, bonus: torch.Tensor, matrix: AdjacencyMatrix, budget: int,
                            depth: int) -> dict[str, torch.Tensor]:
        """On a GPU the next matrix tree rides the step's sync, to be merged on the host in `observe` (on a CPU
        `lookahead` grows it on the host)."""
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
        """The merged plan's trusted expected-acceptance curve (None: not sized by cost, or no plan yet: an
        answer's first step drafts nothing)."""
        if not self.sized_by_cost or self.plan is None:
            return None
        return self.trusted(self.plan.expected(self.plan.ranked()))

    def lookup(self) -> list[Match]:
        """The continuations of the conversation's suffix: in the conversation (MAX_MATCHES), then in the warm
        start's answers (LIBRARY_MATCHES more, each with a next token not found already). The library's runs are
        rated as an earlier conversation's, and learned apart from this conversation's."""
        found = self.index.lookup(MAX_MATCHES, RETRIEVAL_DEPTH)
        if self.library is None:
            return found
        suffix = self.index.stream[-MAX_MATCH:]
        return found + self.library.continuations(suffix, LIBRARY_MATCHES, RETRIEVAL_DEPTH,
                                                  {m.tokens[0] for m in found if m.tokens})

    def learn_verified(self, result: StepResult) -> None:
        """Calibrate on the whole plan, not only its drafted part (adaptive.tested_candidates)."""
        plan, kept = self.plan, self.kept
        if plan is None or len(kept) != len(result.parents):
            return self.learn_drafted(result)
        self.count(*tested_candidates(plan.tokens, plan.parents, plan.depths, plan.keys, kept, result.accepted,
                                      result.emitted))

    # -- merging ----------------------------------------------------------------------------------------------
    def merge(self, grown: dict[str, list[int]], matches: list[Match]) -> Plan:
        """The matrix tree with every retrieved continuation walked into it (shared where the tokens agree)."""
        n = len(grown["tokens"])
        plan = Plan(tokens=list(grown["tokens"]), parents=list(grown["parents"]), depths=list(grown["depths"]),
                    ranks=list(grown["ranks"]), keys=list(grown["bins"]), sources=["root"] + ["matrix"] * (n - 1),
                    origins=[None] * n, scores=[])
        plan.keys[0] = 0
        child = {(plan.parents[i], plan.tokens[i]): i for i in range(1, n)}
        extra: dict[int, int] = {}  # context-only children per node so far
        for match in matches:
            node, earlier = 0, is_earlier(match)
            for j, token in enumerate(match.tokens[: self.max_depth]):
                length = match.match_len + j
                hit = child.get((node, token))
                if hit is None:
                    hit = len(plan.tokens)
                    rank = self.k + extra.get(node, 0)
                    extra[node] = extra.get(node, 0) + 1
                    plan.tokens.append(token)
                    plan.parents.append(node)
                    plan.depths.append(plan.depths[node] + 1)
                    plan.ranks.append(rank)
                    plan.keys.append(context_key(length, shared=False, contested=match.contested, earlier=earlier))
                    plan.sources.append("context")
                    plan.origins.append(match.origin(j + 1))
                    child[(node, token)] = hit
                elif plan.sources[hit] == "matrix":
                    plan.keys[hit] = context_key(length, shared=True, earlier=earlier)
                    plan.sources[hit] = "both"
                    plan.origins[hit] = match.origin(j + 1)
                node = hit
        rate = self.rate_host
        plan.scores = [1.0] * len(plan.tokens)
        for i in range(1, len(plan.tokens)):
            plan.scores[i] = plan.scores[plan.parents[i]] * rate[plan.keys[i]]
        return plan

    def take_plan(self, plan: Plan, keep: list[int], root: torch.Tensor | None = None) -> Draft:
        """The plan's nodes `keep` (the root first, parents before children) as a Draft (`root`: the root token
        [1] long on the device, when the caller has it)."""
        if len(keep) == 1 and root is not None:  # a zero-draft step (most steps of an answer that accepts little)
            return root_alone(self.name, root, self.max_depth + 1, sources=("root",), origins=(None,))
        remap = {old: new for new, old in enumerate(keep)}
        nodes = {"tokens": [plan.tokens[i] for i in keep], "depths": [plan.depths[i] for i in keep],
                 "parents": [remap[plan.parents[i]] if i else 0 for i in keep],
                 "ranks": [plan.ranks[i] for i in keep], "scores": [plan.scores[i] for i in keep],
                 "bins": [plan.keys[i] for i in keep]}
        return host_draft(self.name, nodes, self.max_depth + 1, self.device,
                          sources=tuple(plan.sources[i] for i in keep), origins=tuple(plan.origins[i] for i in keep))


def live_part(grown: dict[str, list]) -> dict[str, list]:
    """A device-grown matrix tree without its nodes under unwritten rows (score 0, and so are their subtrees'), as
    `adaptive.grow_lists` grows it on a CPU: parents renumbered, the root kept."""
    keep = [i for i, score in enumerate(grown["scores"]) if i == 0 or score > 0]
    if len(keep) == len(grown["scores"]):
        return grown
    new = {old: i for i, old in enumerate(keep)}
    out = {name: [values[i] for i in keep] for name, values in grown.items()}
    out["parents"] = [new[grown["parents"][i]] if i else 0 for i in keep]
    return out


__all__ = ["HybridDrafter", "Plan", "context_key", "live_part"]
