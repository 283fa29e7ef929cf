"""vLLM's `custom_class` speculative proposer: the best chain of each request's tree (`chains.draft_chains`), from a
matrix and calibration the runner hook feeds (`hook.py`). vLLM's rejection sampler verifies: output is vLLM's own."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .calibration import Acceptance
from .chains import batch_contexts, draft_chains
from .matrix import SharedMatrix
from .support import check_supported

MIN_REACH = 0.2  # draft while the chain's estimated acceptance up to here is at least this (docs/vllm.md#results)
REACH_ENV = "TR_VLLM_MIN_REACH"  # overrides MIN_REACH (0 < value <= 1)
EXPLORE = 32  # every this many steps, draft full chains whatever the estimates, so a low rate can recover


def min_reach_setting() -> float:
    """MIN_REACH, or the value of $TR_VLLM_MIN_REACH; a clear error for anything but a number in (0, 1]."""
    text = os.environ.get(REACH_ENV, str(MIN_REACH))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{REACH_ENV}={text!r}: give a number in (0, 1], for example 0.2")
    return value


class TokenRecyclingProposer:
    """One per vLLM worker: the shared adjacency matrix, its calibration and the drafts of the last step."""

    RECYCLES = True  # how hook.py recognises this drafter without importing this module

    def __init__(self, vllm_config: Any) -> None:
        check_supported()
        from . import cpu_fixes, hook

        spec = vllm_config.speculative_config
        self.max_draft = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.device = torch.device(vllm_config.device_config.device)
        self.matrix = SharedMatrix(vllm_config.model_config.get_vocab_size(), self.device)
        self.acceptance = Acceptance(self.device)
        self.min_reach = min_reach_setting()
        self.pending: dict[tuple[int, tuple[int, ...]], list[int]] = {}  # (last token, draft) -> its kinds
        self.calls = 0  # propose calls so far (every EXPLORE-th explores)
        hook.install()
        cpu_fixes.install()

    def load_model(self, model: Any) -> None:
        """vLLM hands over the target model; the matrix needs nothing from it."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """One draft per request of the batch ([] for a request still in prefill or at its length limit)."""
        rows = [i for i, got in enumerate(sampled_token_ids) if got]
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if not rows:
            return drafts
        lengths = [int(num_tokens_no_spec[i]) for i in rows]
        histories = [token_ids_cpu[i, :n] for i, n in zip(rows, lengths)]
        caps = torch.tensor([max(0, min(self.max_draft, self.max_model_len - n - 1)) for n in lengths],
                            device=self.device)
        last = torch.tensor([int(h[-1]) for h in histories], device=self.device)
        contexts = batch_contexts(histories, self.max_draft, self.device)
        self.calls += 1
        min_reach = self.min_reach if self.calls % EXPLORE else 0.0
        chains = draft_chains(last, contexts, self.matrix.ids, self.matrix.probs, self.acceptance, min_reach, caps)
        tokens, kinds = chains.lists()
        self.pending = {(int(h[-1]), tuple(draft)): kind for h, draft, kind in zip(histories, tokens, kinds) if draft}
        for i, draft in zip(rows, tokens):
            drafts[i] = draft
        return drafts

    def observe(self, firsts: list[int], drafts: list[list[int]], accepted: list[int]) -> None:
        """Calibrate from one verified step: request i's last token, its draft and how many were accepted."""
        kinds, counts = [], []
        for first, draft, n in zip(firsts, drafts, accepted):
            kind = self.pending.get((first, tuple(draft)))
            if draft and kind is not None and len(kind) == len(draft):
                kinds.append(kind)
                counts.append(n)
        if kinds:
            self.acceptance.record(kinds, counts)
