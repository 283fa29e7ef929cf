"""A correction to vLLM 0.32's CPU stand-in for the rejection sampler's `expand_kernel`, which casts temperatures to
int64 so that sampling is not lossless (docs/vllm.md); installed in engines using the Token Recycling proposer."""
from __future__ import annotations

import torch


def expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from: float,
           replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803 - the kernel's own name
    """output [T] [t] = input_val [B] [b] for each token t of request b (cu_num_tokens [B] cumulative), with
    replace_from replaced by replace_to."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(values.repeat_interleave(counts, output_size=output.shape[0]).to(output.dtype))


def install() -> bool:
    """Register `expand` in the worker where vLLM runs C++ stand-ins for the sampler's Triton kernels (a CPU without
    Triton), after the platform's own. True if done."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand})
    return True
