"""`amptrain serve` of a language model as a process, called by the official `openai` client:
a LoRA run on the tiny Llama 3 answers a greedy chat as `amptrain predict --chat` does and as
`transformers` does through the same template (the run exported, in `make venv-hf`'s
environment), streams the same text in pieces, samples as `predict` does under the same seed,
refuses bad requests with 400s while 16 good ones at once all succeed, and stops on SIGTERM
with 0. SmolLM2's own folder, served, replies as `predict --chat` and `transformers` do."""

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import forked_cli  # tests/: `amptrain` forked after the import
import pytest
from pretrained.test_causal import folder
from pretrained.test_causal_runs import LORA_CONFIG
from pretrained.test_transformers_export_runs import CHECK, data, hf_python  # noqa: F401  (fixtures, shared)

import amptrain

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
URL = re.compile(r"at (http://127\.0\.0\.1:\d+/v1) ")
NEW_TOKENS = 8
CHATS = [
    [{"role": "user", "content": "Hola"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
]
SMOLLM2 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "pretrained",
                       "SmolLM2-135M-Instruct")  # fmt: skip


class Server:
    """`amptrain serve SOURCE --port 0` in a process of its own; `client` an `openai.OpenAI`
    at its base URL, once it printed it."""

    def __init__(self, source, log):
        self.log = log
        log.write_text("")
        self.process = forked_cli.start(["serve", str(source), "--port", "0"], output=log)
        deadline = time.monotonic() + 300
        while not (found := URL.search(log.read_text())):
            assert self.process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        self.client = openai.OpenAI(base_url=found.group(1), api_key="unused", max_retries=0, timeout=300)
        self.model = self.client.models.list().data[0].id

    def chat(self, messages, **settings):
        settings = {"temperature": 0, "max_tokens": NEW_TOKENS, **settings}
        return self.client.chat.completions.create(model=self.model, messages=messages, **settings)

    def streamed(self, messages):
        chunks = self.chat(messages, stream=True, stream_options={"include_usage": True})
        parts, finish, usage = [], None, None
        for chunk in chunks:
            usage = chunk.usage or usage
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return [p for p in parts if p], finish, usage

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def transformers_replies(hf_python, export, tmp_path, chats=CHATS, new_tokens=NEW_TOKENS):  # noqa: F811
    request = tmp_path / "chats.json"
    request.write_text(json.dumps({"texts": [], "chats": chats, "max_new_tokens": new_tokens}), encoding="utf-8")
    done = subprocess.run([hf_python, CHECK, str(export), str(request)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["replies"]


def predicted(source, chats=CHATS, **generate):
    """`amptrain predict SOURCE --chat` of each chat's user message, after its system one."""
    overrides = [f"generate.{k}={v}" for k, v in {"max_new_tokens": NEW_TOKENS, **generate}.items()]
    replies = []
    for messages in chats:
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        replies += [
            r["reply"] for r in amptrain.api.chat(str(source), [messages[-1]["content"]], system, overrides=overrides)
        ]
    return replies


@pytest.fixture(scope="module")
def served_run(data, tmp_path_factory):  # noqa: F811
    folder_ = tmp_path_factory.mktemp("openai")
    config = LORA_CONFIG.format(dir=data, pretrained=folder("llama3")).replace("max_length = 64", "max_length = 128")
    (folder_ / "lora.toml").write_text(config.replace("steps = 30", "steps = 6").replace("every = 10", "every = 6"))
    run = folder_ / "chat-run"
    amptrain.fit(str(folder_ / "lora.toml"), run_dir=str(run))
    server = Server(run, folder_ / "serve.log")
    yield server, run
    server.stop()


def test_a_greedy_chat_is_predicts_and_transformers_reply_streamed_alike(served_run, hf_python, tmp_path):  # noqa: F811
    server, run = served_run
    assert server.model == "chat-run" and [m.id for m in server.client.models.list().data] == ["chat-run"]
    answers = [server.chat(messages) for messages in CHATS]
    replies = [a.choices[0].message.content for a in answers]
    assert replies == predicted(run)
    exported = amptrain.export(str(run), fmt="transformers")["path"]
    theirs = transformers_replies(hf_python, exported, tmp_path)
    assert replies == [t["reply"] for t in theirs]
    for answer, their in zip(answers, theirs):
        assert answer.usage.prompt_tokens == len(their["ids"])
        assert answer.usage.completion_tokens <= NEW_TOKENS and answer.choices[0].finish_reason in ("stop", "length")
    parts, finish, usage = server.streamed(CHATS[0])
    assert "".join(parts) == replies[0] and len(parts) > 1
    assert finish == answers[0].choices[0].finish_reason and usage == answers[0].usage


def test_a_seeded_sample_a_stop_string_and_completions_are_predicts(served_run):
    server, run = served_run
    sampled = server.chat(CHATS[0], temperature=0.9, top_p=0.8, seed=5).choices[0].message.content
    assert sampled == predicted(run, temperature=0.9, top_p=0.8, seed=5)[0]
    greedy = server.chat(CHATS[0]).choices[0].message.content
    stop = next(greedy[i : i + 2] for i in range(2, len(greedy)) if "\ufffd" not in greedy[i : i + 2])
    cut = server.chat(CHATS[0], stop=[stop]).choices[0]
    assert cut.message.content == greedy[: greedy.index(stop)] and cut.finish_reason == "stop"
    text = "In the beginning"
    completion = server.client.completions.create(model=server.model, prompt=text, temperature=0, max_tokens=8)
    record = amptrain.predict(str(run), [text], overrides=["generate.max_new_tokens=8"])[0]
    assert completion.choices[0].text == record["generated"]


def test_bad_requests_are_400s_while_16_good_ones_at_once_all_succeed(served_run):
    server, _ = served_run
    greedy = server.chat(CHATS[0]).choices[0].message.content
    bad = [
        {"max_tokens": 500},  # more than the 128 positions leave
        {"messages": [{"role": "robot", "content": "x"}]},
        {"n": 3},
        {"temperature": -1},
    ]
    calls = [bad[i // 5] if i % 5 == 0 else None for i in range(20)]  # 4 bad among 16 good

    def call(change):
        if change is None:
            return 200, server.chat(CHATS[0]).choices[0].message.content
        change = dict(change)
        try:
            server.chat(change.pop("messages", CHATS[0]), **change)
        except openai.BadRequestError as error:
            return error.status_code, error.body["message"]
        return 200, "accepted"

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(call, calls))
    assert [a for a, c in zip(answers, calls) if c is None] == [(200, greedy)] * 16
    assert [a[0] for a, c in zip(answers, calls) if c is not None] == [400] * 4
    assert "maximum context length is 128 tokens" in answers[0][1]
    with pytest.raises(openai.NotFoundError):
        server.client.chat.completions.create(model="gpt-4o", messages=CHATS[0])
    assert server.stop() == 0


@pytest.mark.skipif(not os.path.isdir(SMOLLM2), reason="no SmolLM2: `make pretrained-llm` fetches it")
def test_smollm2_served_replies_as_predict_and_transformers(hf_python, tmp_path):  # noqa: F811
    chats = CHATS[1:]  # one conversation (each costs `predict` a model load and a trace)
    server = Server(SMOLLM2, tmp_path / "serve.log")
    try:
        replies = [server.chat(messages, max_tokens=NEW_TOKENS * 3).choices[0].message.content for messages in chats]
    finally:
        assert server.stop() == 0
    assert replies == [t["reply"] for t in transformers_replies(hf_python, SMOLLM2, tmp_path, chats, NEW_TOKENS * 3)]
    assert replies == predicted(SMOLLM2, chats, max_new_tokens=NEW_TOKENS * 3)
