"""Helpers for the app tests: launch `python app.py` on a free port in a subprocess and wait until it serves."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(timeout_s: float = 120.0, extra_args: list[str] | None = None):
    """Yield the URL of a freshly started app; its log is kept in .pytest_cache if it fails to come up."""
    with running_app_proc(timeout_s, extra_args) as (url, _proc):
        yield url


@contextlib.contextmanager
def running_app_proc(timeout_s: float = 120.0, extra_args: list[str] | None = None, env: dict[str, str] | None = None):
    """Start `python app.py` on a free port; yield (url, process) once it serves. `env`: extra variables."""
    port = free_port()
    full_env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **(env or {}))
    log = open(ROOT / ".pytest_cache" / f"app-{port}.log", "w") if (ROOT / ".pytest_cache").is_dir() else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *(extra_args or [])],
                            cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with code {proc.returncode} before serving")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not serve {url} within {timeout_s:.0f} s")
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if log is not subprocess.DEVNULL:
            log.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time used so far by a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
