"""vLLM's `vllm.general_plugins` entry point: installs the runner hook in every vLLM process. On an unsupported vLLM
it logs why and changes nothing; asking for the proposer then fails with the reason."""
from __future__ import annotations

import logging

from .support import UnsupportedVLLM, check_supported


def register() -> None:
    """Install the hook if this vLLM is supported (idempotent: vLLM may call plugins more than once)."""
    try:
        check_supported()
        from . import hook

        hook.install()
    except UnsupportedVLLM as error:
        logging.getLogger("tr_core.vllm").warning("Token Recycling is not available: %s", error)
