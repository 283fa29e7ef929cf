"""Token Recycling inside vLLM (0.32.x): a `custom_class` speculative proposer and the runner hook that feeds it.

    from vllm import LLM
    llm = LLM(model=..., speculative_config={"method": "custom_class",
                                             "model": "tr_core.vllm.TokenRecyclingProposer",
                                             "num_speculative_tokens": 8})

Installed into vLLM's environment, its `vllm.general_plugins` entry point installs the hook in every worker.
Importing this module does not import vLLM. See docs/vllm.md."""
from .proposer import TokenRecyclingProposer
from .support import SUPPORTED_TEXT, UnsupportedVLLM, check_supported

__all__ = ["SUPPORTED_TEXT", "TokenRecyclingProposer", "UnsupportedVLLM", "check_supported"]
