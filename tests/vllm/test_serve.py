"""`vllm serve` with Token Recycling, as the README shows it, answers an OpenAI client on localhost exactly as
vLLM without speculation does (greedy, float32), and its metrics show drafts accepted."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from vllm_support import TR, make_llm, questions, shut, model_dir  # noqa: F401 - model_dir is a fixture

MAX_TOKENS = 48
START_TIMEOUT = 300  # seconds for the server to load the model and answer /health


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model_dir: str, port: int) -> list[str]:
    """The README's command line (docs/vllm.md), on a free local port."""
    vllm = str(Path(sys.executable).with_name("vllm"))
    return [vllm, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "1024", "--enforce-eager", "--seed", "0",
            "--speculative-config", json.dumps(TR)]


def wait_healthy(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"vllm serve exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"vllm serve did not answer /health within {START_TIMEOUT} s")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    process = subprocess.Popen(serve_command(model_dir, port), stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        wait_healthy(process, port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def accepted_tokens(base: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_openai_client_gets_plain_vllm_answers(server, model_dir):
    from openai import OpenAI
    from vllm import SamplingParams

    prompts = questions(4, 2)
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    served = [client.chat.completions.create(model=model_dir, messages=p, temperature=0, max_tokens=MAX_TOKENS)
              .choices[0].message.content for p in prompts]
    plain = make_llm(model_dir, None)
    try:
        expected = [o.outputs[0].text for o in
                    plain.chat(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)]
    finally:
        shut(plain)
    assert served == expected
    assert accepted_tokens(server) > 0
