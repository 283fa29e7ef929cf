"""The app as visitors meet it, end to end: `python app.py` in a subprocess, driven by gradio_client.

Public mode (refused model names, several visitors, a client killed mid-answer, New chat during an answer,
temporary folders of closed sessions), its limits (time limit per answer, slow-motion cap, bad characters),
and the speedup meter of a private instance while the machine is busy. Three app launches in all (one per
class). Nothing is timed: where an answer must stop, the test waits (with a generous bound against hanging) for
the app's decode log to say how that decode ended (conftest_app.log_decodes).
"""
from __future__ import annotations

import glob
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest_app import decode_ends, running_app_proc

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")

TEMP_PREFIX = "tr-studio-"  # studio.session.TEMP_PREFIX
LONG_QUESTION = "Write a long story about a robot who learns to paint."
EMBEDDED_LABEL = "embedded (SmolLM2-135M-Instruct)"
CHAT_PARAMS = ("message", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "template", "compare", "k",
               "delay", "colour", "repetition_penalty")  # /chat's inputs in page order (the State follows)
CHAT_DEFAULTS = dict(max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0, seed=0, template="2.2.2",
                     compare=False, k=8, delay=0.0, colour=True, repetition_penalty=1.0)


# ----------------------------------------------------------------------------------------------- helpers


def new_client(url: str):
    return gradio_client.Client(url, verbose=False)


def close_client(client) -> None:
    """Stop the client's heartbeat (the server's unload fires once that stream ends)."""
    close = getattr(client, "close", None)
    if close is not None:
        close()


def chat(client, message: str, **settings):
    return client.submit(message=message, **dict(CHAT_DEFAULTS, **settings), api_name="/chat")


def text_of(message: dict) -> str:
    content = message["content"]
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def plain_text(message: dict) -> str:
    """A chat message's text without the colour spans."""
    return re.sub(r"<[^>]+>", "", text_of(message))


def wait_for(predicate, timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()


def streaming(job) -> bool:
    """True once the job has streamed at least one decoding step (status 'Step n · m tokens')."""
    return any(len(o) > 2 and isinstance(o[2], str) and o[2].startswith("Step ") for o in job.outputs())


def kill_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def decode_end(log: Path, max_new_tokens: int, timeout_s: float = 90.0) -> tuple[str, int]:
    """How the app's next decode asked for `max_new_tokens` ended: (stop reason, new tokens), waiting for it up to
    `timeout_s` (a bound against hanging, not a speed: a decode that is never stopped fails here or by its reason)."""
    assert wait_for(lambda: decode_ends(log, max_new_tokens), timeout_s, every_s=0.2), \
        f"no decode of {max_new_tokens} tokens ended within {timeout_s:.0f} s: {log.read_text()[-500:]}"
    return decode_ends(log, max_new_tokens)[0]


def studio_folders(tmp: Path) -> set[str]:
    return set(glob.glob(str(tmp / f"{TEMP_PREFIX}*")))


def chat_fn_index(client) -> int:
    for i, dep in enumerate(client.config["dependencies"]):
        if dep.get("api_name") == "chat":
            return dep.get("id", i)
    raise AssertionError("no /chat endpoint in the app's config")


def raw_chat(url: str, session_hash: str, fn_index: int, message: str, timeout_s: float = 120.0, **settings) -> dict:
    """Post a /chat request by hand, its JSON escaped as ASCII (so a lone surrogate travels as '\\ud800', which
    gradio_client cannot encode), and read the queue's event stream until it completes; return that message."""
    s = dict(CHAT_DEFAULTS, **settings)
    data = [message] + [s[p] for p in CHAT_PARAMS[1:]] + [None]  # the session State goes last, empty
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session_hash, "event_data": None,
                       "trigger_id": None}, ensure_ascii=True)
    r = httpx.post(url + "gradio_api/queue/join", content=body.encode("ascii"),
                   headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 200, f"queue/join answered {r.status_code}: {r.text[:300]}"
    event_id = r.json()["event_id"]
    deadline = time.monotonic() + timeout_s
    with httpx.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session_hash},
                      timeout=httpx.Timeout(timeout_s, connect=10)) as resp:
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                break
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("event_id") == event_id and msg.get("msg") == "process_completed":
                return msg
    raise AssertionError(f"no answer to the raw /chat request within {timeout_s:.0f} s")


# --------------------------------------------------------------------------- public mode (fixture A)


@pytest.fixture(scope="class")
def public_app(tmp_path_factory):
    """A public instance with its own temporary directory (so its tr-studio-* folders can be counted alone)."""
    tmp = tmp_path_factory.mktemp("public-app-tmp")
    log = tmp_path_factory.mktemp("public-app-log") / "decodes.log"
    with running_app_proc(extra_args=["--public"], env={"TMPDIR": str(tmp)}, decode_log=log) as (url, proc):
        yield url, proc, tmp, log


class TestPublicMode:
    def test_refused_model_names_all_get_the_same_short_answer(self, public_app):
        url, _, _, log = public_app
        client = new_client(url)
        try:
            # a refusal loads nothing (tests/test_app.py checks in process that the catalogue's loader is never
            # called for these names) and starts no decode
            names = ["/etc/passwd", "/etc", "/no/such/path", "no-such-org/no-such-model", "../../x.gguf", "x" * 400]
            statuses = []
            decodes = log.read_text() if log.exists() else ""
            for name in names:
                status = client.predict(name, api_name="/load_model")[2]
                assert "not offered" in status, status
                for leak in (name, "passwd", "json", "config"):
                    assert leak not in status, f"the refusal of {name[:40]!r} echoes {leak[:40]!r}: {status}"
                statuses.append(status)
            assert len(set(statuses)) == 1, statuses
            assert (log.read_text() if log.exists() else "") == decodes, "a refused name started a decode"
            status = client.predict(EMBEDDED_LABEL, api_name="/load_model")[2]
            assert status.startswith("✓ Loaded"), status
        finally:
            close_client(client)

    def test_three_visitors_at_once_get_the_same_greedy_answer(self, public_app):
        url, _, _, _ = public_app
        clients = [new_client(url) for _ in range(3)]
        try:
            jobs = [chat(c, "Name three colours of the rainbow.", max_new_tokens=32, temperature=0)
                    for c in clients]
            finals = [job.result(timeout=150) for job in jobs]
            answers = []
            for final in finals:
                conversation, status = final[0], final[2]
                assert len(conversation) == 2 and conversation[-1]["role"] == "assistant", (conversation, status)
                answers.append(plain_text(conversation[-1]).strip())
            assert answers[0], finals[0][2]
            assert answers[0] == answers[1] == answers[2], answers
        finally:
            for c in clients:
                close_client(c)

    def test_new_chat_during_an_answer_stops_and_drops_it(self, public_app):
        url, _, _, log = public_app
        client = new_client(url)
        try:
            job = chat(client, LONG_QUESTION, max_new_tokens=300)
            assert wait_for(lambda: streaming(job) or job.done(), 120), "the answer never started streaming"
            assert not job.done(), "the 300-token answer ended before New chat could be tried"
            out = client.predict(api_name="/new_chat")
            assert out[0] == [] and "New conversation" in out[2], out[:3]
            reason, tokens = decode_end(log, 300)  # New chat stopped the decode: it did not run to its end
            assert reason == "stopped" and tokens < 300, (reason, tokens)
            final = job.result(timeout=60)
            assert final[0] == [], f"the dropped answer's final chat is not empty: {final[0]}"
            after = chat(client, "Name a fruit.", max_new_tokens=12).result(timeout=120)
            conversation = after[0]
            assert [m["role"] for m in conversation] == ["user", "assistant"], conversation
            assert plain_text(conversation[0]) == "Name a fruit." and plain_text(conversation[1]).strip(), conversation
        finally:
            close_client(client)

    def test_closed_sessions_leave_no_temporary_folders(self, public_app):
        url, _, tmp, _ = public_app
        before = studio_folders(tmp)
        # a fresh session that only replays creates nothing
        fresh = new_client(url)
        try:
            status = fresh.predict(1, True, api_name="/replay")[2]
            assert "Nothing to replay" in status, status
            assert studio_folders(tmp) - before == set(), "/replay without a chat created a folder"
        finally:
            close_client(fresh)
        closers: list[threading.Thread] = []
        peak = 0
        for i in range(20):
            client = new_client(url)
            try:
                final = chat(client, f"Say the number {i}.", max_new_tokens=8).result(timeout=120)
                assert final[0] and final[0][-1]["role"] == "assistant", final[2]
                if i % 4 == 0:
                    status = client.predict(api_name="/save_matrix")[2]
                    assert "Matrix saved" in status, status
                peak = max(peak, len(studio_folders(tmp) - before))
            finally:  # close() waits for the next heartbeat line: close in the background
                t = threading.Thread(target=close_client, args=(client,), daemon=True)
                t.start()
                closers.append(t)
        assert peak >= 1, "no session folder was ever made: the test would not see a leak"
        for t in closers:
            t.join(timeout=30)
        # the server notices a closed heartbeat stream at its next heartbeat (15 s), then unload removes the folder
        wait_for(lambda: not (studio_folders(tmp) - before), 40, every_s=0.5)
        left = studio_folders(tmp) - before
        assert len(left) <= 1, f"{len(left)} of 20 closed sessions left their folders: {sorted(left)[:5]}"

    def test_a_client_killed_mid_answer_leaves_the_server_idle(self, public_app):
        url, _, _, log = public_app
        script = (
            "import sys, time\n"
            "from gradio_client import Client\n"
            "c = Client(sys.argv[1], verbose=False)\n"
            f"job = c.submit(message={LONG_QUESTION!r}, max_new_tokens=400, compare=False,"
            " template='adaptive-fixed', api_name='/chat')\n"
            "deadline = time.monotonic() + 120\n"
            "while time.monotonic() < deadline and not any(len(o) > 2 and isinstance(o[2], str)"
            " and o[2].startswith('Step ') for o in job.outputs()):\n"
            "    time.sleep(0.05)\n"
            "print('STREAMING' if not job.done() else 'DONE', flush=True)\n"
            "time.sleep(600)\n"
        )
        visitor = subprocess.Popen([sys.executable, "-c", script, url], stdout=subprocess.PIPE, text=True)
        try:
            line = [""]
            reader = threading.Thread(target=lambda: line.__setitem__(0, visitor.stdout.readline()), daemon=True)
            reader.start()
            reader.join(timeout=150)
            assert line[0].strip() == "STREAMING", f"the visitor's answer did not stream: {line[0]!r}"
            assert decode_ends(log, 400) == [], "the visitor's answer ended before its visitor could be killed"
            visitor.kill()
            visitor.wait(timeout=10)
            # the request closed with its visitor, and that stopped the decode (the log's app lets nothing else stop
            # it before the 120 s time limit): an abandoned answer that kept decoding would end by its length or eos
            reason, tokens = decode_end(log, 400)
            assert reason == "stopped" and tokens < 400, (reason, tokens)
        finally:
            kill_proc(visitor)


# ----------------------------------------------------------------- public limits (fixture B)


@pytest.fixture(scope="class")
def limited_app(tmp_path_factory):
    log = tmp_path_factory.mktemp("limited-app-log") / "decodes.log"
    with running_app_proc(extra_args=["--public", "--time-limit", "3"], decode_log=log) as (url, proc):
        yield url, log


class TestPublicLimits:
    def test_time_limit_stops_a_long_answer_and_slow_motion_is_capped(self, limited_app):
        url, log = limited_app
        client = new_client(url)
        try:
            # a short answer first: the model is loaded and warm, so the limited answer is decoding only
            chat(client, "Say hi.", max_new_tokens=4, template="adaptive-fixed").result(timeout=240)
            final = chat(client, LONG_QUESTION, max_new_tokens=1024, template="adaptive-fixed").result(timeout=120)
            # the page says "time limit" only when the decode was stopped past its deadline (studio.recording)
            assert "time limit" in final[2], final[2]
            reason, tokens = decode_end(log, 1024)
            assert reason == "stopped" and tokens < 1024, (reason, tokens)
            assert plain_text(final[0][-1]).strip(), "the answer so far was not kept"
            final = chat(client, "Say hi.", max_new_tokens=4, delay=3.0).result(timeout=120)
            assert "capped at 0.5 s" in final[2], final[2]
        finally:
            close_client(client)

    def test_broken_and_control_characters_get_a_clear_message_and_the_session_goes_on(self, limited_app):
        url, _ = limited_app
        client = new_client(url)
        try:
            msg = raw_chat(url, client.session_hash, chat_fn_index(client), "bad \ud800 text", max_new_tokens=8)
            assert msg.get("success") is True, msg
            status = msg["output"]["data"][2]
            assert "broken character" in status, status
            final = chat(client, "Name a colour.", max_new_tokens=12).result(timeout=120)
            assert final[0] and final[0][-1]["role"] == "assistant" and plain_text(final[0][-1]).strip(), final[2]
            final = chat(client, "ring \x07 bell", max_new_tokens=8).result(timeout=60)
            assert "control character" in final[2], final[2]
        finally:
            close_client(client)


# ------------------------------------------------------------ the meter under load (fixture C)


@pytest.fixture(scope="class")
def one_thread_app():
    with running_app_proc(extra_args=["--threads", "1"]) as (url, proc):
        yield url, proc


RATIO = re.compile(r'id="tr-ratio">([0-9.]+)×(?: ± ([0-9.]+))?<')
MEAN_ACCEPTED = re.compile(r'id="tr-mat">([0-9.]+)<')
METER_STATE = re.compile(r'id="tr-meter" data-state="([a-z-]+)"')
PLAIN_UNSHOWN = 'id="tr-plain">—<'


class TestMeterUnderLoad:
    def test_a_busy_machine_never_shows_more_speedup_than_the_accepted_tokens_allow(self, one_thread_app):
        url, _ = one_thread_app
        client = new_client(url)
        try:
            for attempt in range(2):
                client.predict(api_name="/new_chat")
                job = chat(client, LONG_QUESTION, max_new_tokens=96, template="2.2.2", compare=True)
                busy: list[subprocess.Popen] = []
                try:
                    measuring = wait_for(lambda: job.done() or any(
                        len(o) > 2 and isinstance(o[2], str) and "Measuring the speedup" in o[2]
                        for o in job.outputs()), 150, every_s=0.05)
                    assert measuring and not job.done(), "the speed measurement never started"
                    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
                    final = job.result(timeout=120)
                finally:
                    for p in busy:
                        kill_proc(p)
                meter = final[3]
                state = METER_STATE.search(meter)
                assert state and state.group(1) in ("measured", "noisy"), \
                    f"attempt {attempt + 1}: the final meter shows no result: {meter}"
                if state.group(1) == "noisy":  # an honest "too noisy": no ratio, nor a plain speed that implies one
                    assert not RATIO.search(meter) and PLAIN_UNSHOWN in meter, \
                        f"attempt {attempt + 1}: a meter too noisy to measure still shows a speedup: {meter}"
                    continue
                ratio, mean_acc = RATIO.search(meter), MEAN_ACCEPTED.search(meter)
                assert ratio and mean_acc, f"attempt {attempt + 1}: the final meter shows no result: {meter}"
                r, m = float(ratio.group(1)), float(mean_acc.group(1))
                assert r <= 1.2 * m, (f"attempt {attempt + 1}: the meter shows {r:.2f}× with {m:.2f} accepted "
                                      f"tokens/step under load: {meter}")
        finally:
            close_client(client)
