"""Helpers for the app tests: launch `python app.py` on a free port in a subprocess and wait until it serves.

With a decode log, the app runs through this file (`python tests/conftest_app.py LOG app.py ARGS...`): every decode
of its engines appends what it was asked and how it ended to LOG (see `log_decodes`), so that a test can wait for a
decode to end and read why it ended, instead of timing the app or counting its CPU seconds.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import runpy
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
def running_app_proc(timeout_s: float = 120.0, extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                     decode_log: Path | None = None):
    """Start `python app.py` on a free port; yield (url, process) once it serves. `env`: extra variables;
    `decode_log`: a file the app's decodes are logged to (`log_decodes`)."""
    port = free_port()
    full_env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **(env or {}))
    log = open(ROOT / ".pytest_cache" / f"app-{port}.log", "w") if (ROOT / ".pytest_cache").is_dir() else subprocess.DEVNULL
    launcher = [str(Path(__file__).resolve()), str(decode_log)] if decode_log is not None else []
    proc = subprocess.Popen([sys.executable, *launcher, str(ROOT / "app.py"), "--port", str(port), *(extra_args or [])],
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


def log_decodes(path: Path) -> None:
    """In the app's process: append a line to `path` when an engine starts a decode ("start N", N its max new tokens)
    and when it ends ("end N REASON TOKENS": its summary's stop reason and new tokens; "closed N" when closed before
    its summary). A decode may then be stopped only by its request (closed, Stop, New chat) or the time limit:
    record_live's stop for a consumer that stopped pulling (`abandon_s`, a safety net) is turned off."""
    from studio import recording
    from studio.decode_loop import BatchedEngine
    from tr_core.engine import Engine
    from tr_core.events import SummaryEvent

    def write(line: str) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def logging(generate):
        def logged(self, prompt_ids, cfg=None, *args, **kwargs):
            n = getattr(cfg, "max_new_tokens", None)
            write(f"start {n}")
            run, ended = generate(self, prompt_ids, cfg, *args, **kwargs), False
            try:
                for ev in run:
                    if isinstance(ev, SummaryEvent):
                        write(f"end {n} {ev.stop_reason} {ev.new_tokens}")
                        ended = True
                    yield ev
            finally:
                run.close()
                if not ended:
                    write(f"closed {n}")
        return logged

    # an answer decodes alone (Engine.generate: set-up, slow motion, the meter) or in the shared batch (BatchedEngine)
    Engine.generate = logging(Engine.generate)
    BatchedEngine.generate = logging(BatchedEngine.generate)
    names = [p.name for p in inspect.signature(recording.record_live).parameters.values()
             if p.default is not inspect.Parameter.empty]
    defaults = list(recording.record_live.__defaults__)
    defaults[names.index("abandon_s")] = float("inf")
    recording.record_live.__defaults__ = tuple(defaults)


def decode_ends(path: Path, max_new_tokens: int) -> list[tuple[str, int]]:
    """(stop reason, new tokens) of every decode asked for `max_new_tokens` that ended so far, from a decode log."""
    if not path.exists():
        return []
    ends = []
    for line in path.read_text(encoding="utf-8").splitlines():
        kind, n, *rest = line.split()
        if kind == "end" and n == str(max_new_tokens):
            ends.append((rest[0], int(rest[1])))
        elif kind == "closed" and n == str(max_new_tokens):
            ends.append(("closed", -1))
    return ends


if __name__ == "__main__":  # python tests/conftest_app.py LOG app.py ARGS...: the app, its decodes logged to LOG
    log, *sys.argv = sys.argv[1:]
    sys.path[0] = str(ROOT)  # as `python app.py` has it (and not tests/, whose vllm/ would pass for vLLM)
    log_decodes(Path(log))
    runpy.run_path(sys.argv[0], run_name="__main__")
