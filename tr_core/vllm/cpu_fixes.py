"""A correction to vLLM 0.32's CPU fallback for one rejection-sampler kernel, without which sampling is not lossless.

Without Triton's CPU backend, vLLM runs its rejection sampler through C++ stand-ins
(`vllm.utils.cpu_triton_utils`). The stand-in for `expand_kernel`, which spreads each request's temperature (and
top-p, top-k) over its draft tokens, casts both tensors to int64 first: a temperature of 0.5 becomes 0, and the
result lands in a temporary copy, so the real output keeps whatever memory `new_empty` gave it. Greedy requests
never use it; sampled ones then verify drafts against a distribution at an arbitrary temperature. Measured here
(tests/vllm/test_sampling.py): a position's token distribution moved from 51% to 89% for one token, with vLLM's own
`ngram` drafts as with ours. This module replaces that stand-in with a tensor version in engines that use the
Token Recycling proposer. vLLM's other speculative methods on CPU are left as they are (see docs/vllm.md).
"""
from __future__ import annotations

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from: float,
           replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803 - the kernel's own name
    """output[t] = input_val[b] for each token t of request b (replace_from becomes replace_to), in output's dtype.

    input_val: [B]; cu_num_tokens: [B] cumulative tokens per request; output: [cu_num_tokens[-1]].
    """
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(values.repeat_interleave(counts, output_size=output.shape[0]).to(output.dtype))


def needed() -> bool:
    """Whether this process runs vLLM's C++ stand-ins for the sampler's Triton kernels (CPU without Triton)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def install() -> bool:
    """Register `expand` for the kernel, after the platform's own stand-ins (call from the worker). True if done."""
    if not needed():
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({KERNEL: expand})
    return True
