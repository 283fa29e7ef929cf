"""The installable library: `pip install .` gives `tr_core` and the `token-recycling` command, without the app's packages."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


import pytest


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed (without dependencies) into an empty folder."""
    tmp_path = tmp_path_factory.mktemp("package")
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(wheels),
         str(ROOT)], cwd=tmp_path)
    wheel = next(wheels.glob("token_recycling-*.whl"))
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "--target",
         str(site), str(wheel)], cwd=tmp_path)
    return site


def test_wheel_installs_into_an_empty_folder_and_imports_without_the_app_packages(site, tmp_path):
    assert (site / "tr_core" / "engine.py").is_file() and not (site / "studio").exists()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import sys, tr_core\n"
            "from tr_core import DecodeConfig, Engine\n"
            "assert tr_core.__file__.startswith(%r), tr_core.__file__\n"
            "print(sorted(m for m in ('gradio', 'plotly', 'networkx') if m in sys.modules))\n") % str(site)
    assert run([sys.executable, "-c", code], cwd=outside, env=env).stdout.strip() == "[]"
    script = site / "bin" / "token-recycling"
    help_text = run([sys.executable, str(script), "--help"], cwd=outside, env=env).stdout
    assert "generate" in help_text and "bench" in help_text and "profile" in help_text


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
