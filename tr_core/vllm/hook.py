"""The runner hook: wraps the model runner's `_sample(logits, spec_decode_metadata)` to hand the target logits of every
verified row to the proposer's matrix and calibration (docs/vllm.md#how-it-works); other runners are not touched."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import threading
from typing import Any

import torch

from .support import SUPPORTED_TEXT, UnsupportedVLLM

_LOCK = threading.Lock()
_MARK = "_token_recycling_hook"
METADATA_FIELDS = {"draft_token_ids", "num_draft_tokens", "cu_num_sampled_tokens", "logits_indices"}


def check_internals(runner_class: Any) -> None:
    """Raise UnsupportedVLLM unless the runner's `_sample` and the spec-decode metadata look as on 0.32."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    sample = getattr(runner_class, "_sample", None)
    params = list(inspect.signature(sample).parameters) if sample else []
    fields = {f.name for f in dataclasses.fields(SpecDecodeMetadata)}
    if params[:3] != ["self", "logits", "spec_decode_metadata"] or not METADATA_FIELDS <= fields:
        raise UnsupportedVLLM(f"this vLLM's model runner differs from {SUPPORTED_TEXT}'s (_sample{params}, "
                              f"SpecDecodeMetadata fields {sorted(fields)}); tr_core.vllm cannot read verified rows")


def install() -> bool:
    """Wrap the model runner's `_sample` (once per process). Returns True when it was installed by this call."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    with _LOCK:
        if getattr(GPUModelRunner._sample, _MARK, False):
            return False
        check_internals(GPUModelRunner)
        GPUModelRunner._sample = _wrap(GPUModelRunner._sample)
        return True


def _wrap(sample: Any) -> Any:
    """`sample` reading the logits before sampling (which may scale them in place), and the accepted drafts after."""

    @functools.wraps(sample)
    def sample_and_recycle(runner: Any, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        drafter = getattr(runner, "drafter", None)
        inputs = None
        if getattr(type(drafter), "RECYCLES", False) and logits is not None:  # a TokenRecyclingProposer
            inputs = verified_inputs(runner, spec_decode_metadata, logits.shape[0])
            if inputs is not None:
                drafter.matrix.update(inputs, logits)
        output = sample(runner, logits, spec_decode_metadata)
        if inputs is not None and spec_decode_metadata is not None:
            _calibrate(drafter, inputs, spec_decode_metadata, output.sampled_token_ids)
        return output

    setattr(sample_and_recycle, _MARK, True)
    return sample_and_recycle


def verified_inputs(runner: Any, spec_decode_metadata: Any, rows: int) -> torch.Tensor | None:
    """[rows] the input token behind each logits row, or None when the rows cannot be matched to inputs."""
    if spec_decode_metadata is not None:
        positions = spec_decode_metadata.logits_indices
    else:  # one row per request: its last scheduled token
        num_reqs = runner.input_batch.num_reqs
        positions = runner.query_start_loc.gpu[1: num_reqs + 1] - 1
    if positions.shape[0] != rows:
        return None
    return runner.input_ids.gpu[positions.long()]


def _calibrate(proposer: Any, inputs: torch.Tensor, meta: Any, sampled: torch.Tensor) -> None:
    """Tell the proposer, per request, its last token, its draft and how many of the draft were accepted."""
    counts = meta.num_draft_tokens
    accepted = ((sampled != -1).sum(dim=1) - 1).clamp(min=0).tolist()  # -1: vLLM's placeholder after a rejection
    flat, inputs_list = meta.draft_token_ids.tolist(), inputs.tolist()
    drafts = [flat[start: start + n] for start, n in zip(itertools.accumulate(counts, initial=0), counts)]
    firsts = [inputs_list[end - n - 1] for n, end in zip(counts, meta.cu_num_sampled_tokens.tolist())]
    proposer.observe(firsts, drafts, accepted[: len(counts)])
