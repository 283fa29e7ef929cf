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


def test_wheel_installs_into_an_empty_folder_and_imports_without_the_app_packages(tmp_path):
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(wheels),
         str(ROOT)], cwd=tmp_path)
    wheel = next(wheels.glob("token_recycling-*.whl"))
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "--target",
         str(site), str(wheel)], cwd=tmp_path)
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
