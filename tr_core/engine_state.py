"""What answers teach an engine (the matrix, the cost-sized drafters, the matrix clock) and the one place that forks,
snapshots, restores, packs or replaces it: nothing outside the engine reaches into a drafter or the clock."""
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
    """One tick per prompt seeding and per step; a row's stamp is the tick that wrote it, answer i's first tick is
    answer_starts[i]."""

    tick: int = 0
    answer_starts: list[int] = field(default_factory=list)

    @property
    def answer(self) -> int:
        """The index of the answer begun last (-1 before any)."""
        return len(self.answer_starts) - 1

    def start_answer(self) -> int:
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
        self.adaptive = AdaptiveDrafter(device)  # calibration and forward cost persist across answers
        self.hybrid = HybridDrafter(device)  # so do the hybrid's, and its context index
        self.clock = MatrixClock()
        self.warm: Any = None  # the warm start applied (tr_core.warm.WarmStartInfo), None: the engine started cold

    def _learners(self) -> dict[str, AdaptiveDrafter]:
        return {"adaptive": self.adaptive, "hybrid": self.hybrid}

    def forget(self, to: dict[str, Any] | None = None) -> None:
        """Empty the matrix (or back to the `to` snapshot's), the hybrid's context, the clock; calibration kept."""
        self.matrix.reset()
        if to is not None:
            self.matrix.copy_from(to["matrix"])
        self.hybrid.forget_context()
        self.clock.set(0, [])

    def snapshot(self) -> dict[str, Any]:
        """A copy of all that answers teach this engine (matrix, drafters, clock), for `restore`."""
        return {"matrix": self.matrix.clone(), "drafters": copy.deepcopy((self.adaptive, self.hybrid)),
                "clock": self.clock.tick, "answer_starts": list(self.clock.answer_starts)}

    def restore(self, snapshot: dict[str, Any], keep_costs: bool = False) -> None:
        """Return to a `snapshot` (left as it was); `keep_costs`: keep the forward costs measured since."""
        costs = self.forward_costs()
        self.matrix.copy_from(snapshot["matrix"])
        self.adaptive, self.hybrid = copy.deepcopy(snapshot["drafters"])
        self.clock.set(snapshot["clock"], snapshot["answer_starts"])
        if keep_costs:
            self._use_measured(costs)

    def fork(self, sizes: list[int] | None = None) -> "EngineState":
        """A twin sharing the model, learning on its own; `sizes`: an answer's tree sizes, drafted again."""
        twin = copy.copy(self)
        twin.matrix = self.matrix.clone()
        twin.clock = MatrixClock(self.clock.tick, list(self.clock.answer_starts))
        twin.adaptive, twin.hybrid = _fork_drafter(self.adaptive), _fork_drafter(self.hybrid)
        if sizes is not None:
            twin.adaptive.replay_sizes(sizes)
            twin.hybrid.replay_sizes(sizes)
        return twin

    def state_dict(self) -> dict[str, Any]:
        """What answers taught as CPU tensors and plain data, not the context index (it holds a conversation)."""
        return {"matrix": {name: getattr(self.matrix, name).cpu() for name in self.matrix.TENSORS},
                "clock": self.clock.tick, "answer_starts": list(self.clock.answer_starts),
                "learned": {name: {key: v.cpu() if hasattr(v, "cpu") else v for key, v in learned.items()}
                            for name, learned in self.learned().items()},
                "costs": self.forward_costs()}

    def load_state_dict(self, state: dict[str, Any], costs: bool = False) -> None:
        """Take a `state_dict` (the matrix in place); `costs`: its measured forward costs too."""
        for name, tensor in state["matrix"].items():
            getattr(self.matrix, name).copy_(tensor)
        self.clock.set(state["clock"], state["answer_starts"])
        for name, learned in state["learned"].items():
            self._learners()[name].take_learned(learned)
        if costs:
            self._use_measured(state["costs"])

    def start_session(self) -> None:
        """As a new session finds it: all forgotten, drafters at their priors, no warm start; forward costs kept."""
        self.forget()
        self.adaptive, self.hybrid = _renewed(self.adaptive), _renewed(self.hybrid)
        self.warm = None

    def adopt_warm(self, learned: dict[str, dict], library: Any = None) -> None:
        """Forget all, then take a warm start's `learned()` and library, or change nothing (ValueError)."""
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
        for drafter in self._learners().values():
            drafter.drop_older_row_calibration()

    def forward_costs(self) -> dict[str, ForwardCost]:
        return {name: drafter.cost for name, drafter in self._learners().items()}

    def use_forward_cost(self, name: str, cost: ForwardCost) -> None:
        """Size the `name` drafter's trees ("adaptive" or "hybrid") by `cost` (shared, fresh or frozen)."""
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
    """A deep copy of a drafter; an unmeasured forward cost is shared, so a twin taken before the start-up probe
    reads the probe's result instead of timing the forwards again."""
    cost = drafter.cost
    shared = cost is not None and not getattr(cost, "measured", False)
    return copy.deepcopy(drafter, memo={id(cost): cost} if shared else {})


def _renewed(drafter: AdaptiveDrafter) -> AdaptiveDrafter:
    """A drafter of the same kind at its priors, keeping the forward cost and where it grows trees (`on_host`)."""
    new = type(drafter)(drafter.device, on_host=drafter.on_host)
    new.cost = drafter.cost
    return new
