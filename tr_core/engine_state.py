"""What answers teach an engine, and the one place that forks, snapshots, restores, packs or replaces it.

An engine's learned state is its adjacency matrix, its cost-sized drafters (`adaptive`, `hybrid`: calibration,
trust, measured forward cost; the hybrid's context index and warm-start library) and the matrix clock. The speed
meter's twin (`fork`), the benchmark's repeats (`snapshot` / `restore`), ZeroGPU's process boundary (`state_dict` /
`load_state_dict`), a new session (`start_session`), the warm start (`adopt_warm`, `learned`) and transformers'
parked engines (`Engine.on_model`) all go through `EngineState`, the base of `Engine`: nothing outside the engine
reaches into a drafter or the clock.
"""
from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from .adaptive import AdaptiveDrafter
from .cost import ForwardCost
from .hybrid import HybridDrafter
from .matrix import AdjacencyMatrix

DRAFTERS = ("adaptive", "hybrid")  # the drafters with learned state of their own


@dataclass
class MatrixClock:
    """The matrix's clock: one tick per prompt seeding and per step, across answers. A row's stamp says which tick
    wrote it (provenance, `origin_of`); answer i began at tick answer_starts[i] (its prompt seeding)."""

    tick: int = 0
    answer_starts: list[int] = field(default_factory=list)

    @property
    def answer(self) -> int:
        """The index of the answer begun last (-1 before any)."""
        return len(self.answer_starts) - 1

    def start_answer(self) -> int:
        """Begin an answer at the current tick, which it returns."""
        self.answer_starts.append(self.tick)
        return self.tick

    def set(self, tick: int, answer_starts: list[int]) -> None:
        """Set in place: engines sharing this clock (`Engine.on_model`) follow."""
        self.tick, self.answer_starts = tick, list(answer_starts)

    def origin_of(self, stamp: int) -> list[int]:
        """[answer, step] of a matrix stamp: step -1 is that answer's prompt seeding; [-1, -1] unknown."""
        if stamp < 0 or not self.answer_starts:
            return [-1, -1]
        answer = bisect.bisect_right(self.answer_starts, stamp) - 1
        return [answer, stamp - self.answer_starts[answer] - 1]


class EngineState:
    """The learned state of an engine (the base of `Engine`) and every operation that copies or replaces it."""

    def __init__(self, device: torch.device, vocab_size: int, k: int) -> None:
        self.matrix = AdjacencyMatrix(vocab_size, k, device)
        self.adaptive = AdaptiveDrafter(device)  # learned calibration and forward cost persist across answers
        self.hybrid = HybridDrafter(device)  # so do the hybrid's, and its context index
        self.clock = MatrixClock()
        self.warm: Any = None  # the warm start applied (tr_core.warm.WarmStartInfo), None: the engine started cold

    def _learners(self) -> dict[str, AdaptiveDrafter]:
        return {"adaptive": self.adaptive, "hybrid": self.hybrid}

    def forget(self, to: dict[str, Any] | None = None) -> None:
        """Forget what earlier answers taught: the adjacency matrix (emptied, or back to the matrix of `to`, a
        `snapshot`), the hybrid tree's context index and the warm start's answers it copies from, the clock.

        The drafters' calibration and the measured forward costs are kept (they describe the model and device)."""
        self.matrix.reset()
        if to is not None:
            self.matrix.copy_from(to["matrix"])
        self.hybrid.forget_context()
        self.clock.set(0, [])

    def snapshot(self) -> dict[str, Any]:
        """A copy of all that answers teach this engine: the matrix, the drafters' calibration, trust, forward costs
        and context index, and the matrix clock. `restore` returns to it, e.g. to decode the same answer again from
        the same start (the benchmark's `--repeats`)."""
        return {"matrix": self.matrix.clone(), "drafters": copy.deepcopy((self.adaptive, self.hybrid)),
                "clock": self.clock.tick, "answer_starts": list(self.clock.answer_starts)}

    def restore(self, snapshot: dict[str, Any], keep_costs: bool = False) -> None:
        """Return to a `snapshot` (which stays as it was, for further restores; the matrix is copied in place).
        `keep_costs`: keep the forward costs measured since (they describe the machine, not the answers, and timing
        them again costs seconds)."""
        costs = self.forward_costs()
        self.matrix.copy_from(snapshot["matrix"])
        self.adaptive, self.hybrid = copy.deepcopy(snapshot["drafters"])
        self.clock.set(snapshot["clock"], snapshot["answer_starts"])
        if keep_costs:
            self._use_measured(costs)

    def fork(self, sizes: list[int] | None = None) -> "EngineState":
        """An independent twin sharing the model, with its own matrix, clock and drafter state.

        Taken before an answer, it lets the speed measurement re-run Token Recycling from exactly the state the answer
        started from (the answer itself taught the live matrix its own text, which would flatter it). `sizes` (the
        answer's tree sizes from its second step on, `meter.answer_sizes`): its cost-sized drafters draft them again.
        """
        twin = copy.copy(self)
        twin.matrix = self.matrix.clone()
        twin.clock = MatrixClock(self.clock.tick, list(self.clock.answer_starts))
        twin.adaptive, twin.hybrid = _fork_drafter(self.adaptive), _fork_drafter(self.hybrid)
        if sizes is not None:  # the answer's own tree sizes (cost-sized trees): the twin re-decodes its very steps
            twin.adaptive.replay_sizes(sizes)
            twin.hybrid.replay_sizes(sizes)
        return twin

    def state_dict(self) -> dict[str, Any]:
        """What answers taught, as plain data and CPU tensors (a CUDA tensor must not cross a process boundary): the
        matrix's tensors, the clock, the drafters' calibration and trust (`learned`) and measured forward costs. Not
        the hybrid's context index: it holds a conversation."""
        return {"matrix": {name: getattr(self.matrix, name).cpu() for name in self.matrix.TENSORS},
                "clock": self.clock.tick, "answer_starts": list(self.clock.answer_starts),
                "learned": {name: _cpu(learned) for name, learned in self.learned().items()},
                "costs": self.forward_costs()}

    def load_state_dict(self, state: dict[str, Any], costs: bool = False) -> None:
        """Take a `state_dict` (the matrix in place, on this engine's device); `costs`: its measured forward costs
        too."""
        for name, tensor in state["matrix"].items():
            getattr(self.matrix, name).copy_(tensor)
        self.clock.set(state["clock"], state["answer_starts"])
        for name, learned in state["learned"].items():
            self._learners()[name].take_learned(learned)
        if costs:
            self._use_measured(state["costs"])

    def start_session(self) -> None:
        """The engine as a new session finds it: matrix, clock and context index empty, the drafters' starting
        calibration and trust, no warm start; the forward costs measured on this machine kept."""
        self.forget()
        self.adaptive, self.hybrid = _renewed(self.adaptive), _renewed(self.hybrid)
        self.warm = None

    def adopt_warm(self, learned: dict[str, dict], library: Any = None) -> None:
        """Start from a warm start's drafters: their calibration and trust (`learned`, as `learned()` gives them) and
        the answers the hybrid copies runs from (a tr_core.context.Library, or None); all else forgotten, the matrix
        emptied for the caller to fill. Raises ValueError, changing nothing, when a drafter's state does not fit."""
        for name, drafter in self._learners().items():  # checked first: a misfit changes nothing
            try:
                type(drafter)(drafter.device).take_learned(learned[name])
            except ValueError as exc:
                raise ValueError(f"the warm start's {name} state does not fit: {exc}") from exc
        self.forget()
        for name, drafter in self._learners().items():
            drafter.take_learned(learned[name])
        if library is not None:
            self.hybrid.library = library

    def learned(self) -> dict[str, dict]:
        """Per cost-sized drafter, what it learned that holds on any machine (AdaptiveDrafter.learned)."""
        return {name: drafter.learned() for name, drafter in self._learners().items()}

    def drop_older_row_calibration(self) -> None:
        """Every drafter forgets what it learned of rows written before an answer (AdaptiveDrafter's)."""
        for drafter in self._learners().values():
            drafter.drop_older_row_calibration()

    def forward_costs(self) -> dict[str, ForwardCost]:
        """The cost-sized drafters' forward-cost curves, by drafter name."""
        return {name: drafter.cost for name, drafter in self._learners().items()}

    def use_forward_cost(self, name: str, cost: ForwardCost) -> None:
        """Size the `name` drafter's trees ("adaptive" or "hybrid") by `cost`: another engine's curve of this machine
        (timed once for every session), a fresh one (to time the forwards again) or a frozen one (experiments)."""
        self._learners()[name].cost = cost

    def use_trust_decay(self, decay: float) -> None:
        """Every cost-sized drafter's trust forgets at this rate per step (HindsightTrust.decay; experiments)."""
        for drafter in self._learners().values():
            drafter.trust.decay = decay

    def _use_measured(self, costs: dict[str, ForwardCost | None]) -> None:
        for name, cost in costs.items():
            if cost is not None and getattr(cost, "measured", False):
                self.use_forward_cost(name, cost)


def _fork_drafter(drafter: AdaptiveDrafter) -> AdaptiveDrafter:
    """A deep copy of a drafter. Its forward cost curve is part of the state an answer started from: a cost-sized tree
    sizes every step by it, so a twin re-decoding with the curve the answer left behind would draft other trees. It
    is copied when it was measured before the answer; a twin taken before the answer's start-up probe shares it
    instead and reads the probe's result rather than timing it again (seconds that would come out of the
    measurement's time cap)."""
    cost = drafter.cost
    shared = cost is not None and not getattr(cost, "measured", False)
    return copy.deepcopy(drafter, memo={id(cost): cost} if shared else {})


def _renewed(drafter: AdaptiveDrafter) -> AdaptiveDrafter:
    """A drafter of the same kind at its priors, keeping the forward cost and where it grows trees (`on_host`)."""
    new = type(drafter)(drafter.device, on_host=drafter.on_host)
    new.cost = drafter.cost
    return new


def _cpu(learned: dict) -> dict:
    """A drafter's `learned()` with its tensors on the CPU."""
    return {key: value.cpu() if hasattr(value, "cpu") else value for key, value in learned.items()}
