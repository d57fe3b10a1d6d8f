"""End to end, one tiny run a task (the export tests' runs): `amptrain serve` started as a
process on 127.0.0.1 on a free port, real HTTP requests, and the answers equal to `amptrain
predict`'s records in both formats, alone and 50 at once; every bad input a 4xx with the
server answering after; a new version folder picked up; SIGTERM with requests in flight:
each answered, exit 0. Slow: trains three runs and starts three servers."""

import json
import re
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import forked_cli  # tests/: `amptrain` forked after the import
import numpy as np
import pytest
from export.test_export_runs import classifier, random_ids, tagger, translator  # noqa: F401  (the runs, shared)

import amptrain

pytestmark = pytest.mark.slow
URL = re.compile(r"at (http://127\.0\.0\.1:\d+)/v1/models/(\S+)")


class Server:
    """`amptrain serve EXPORT --port 0` in a process of its own (forked after the import:
    forked_cli.py); `url` once it printed where it listens."""

    def __init__(self, export_dir, folder, *flags):
        self.log = folder / "serve.log"
        command = ["serve", str(export_dir), "--port", "0", *flags]
        self.log.write_text("")  # a file, not a pipe: a server that prints much never blocks
        self.process = forked_cli.start(command, output=self.log)
        deadline = time.monotonic() + 180
        while not (found := URL.search(self.log.read_text())):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.2)
        self.url, self.name = found.group(1), found.group(2)

    def predict(self, body, path=None):
        """(status, JSON answer) of a POST to the predict URL (`body`: an object or bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.call(path or f"/v1/models/{self.name}:predict", data)

    def call(self, path, data=None):
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def served_classifier(classifier, tmp_path_factory):  # noqa: F811
    run, texts = classifier
    amptrain.export(str(run))
    flags = ["--poll-seconds", "1", "--max-instances", "1000", "--header-timeout", "2", "--body-timeout", "2"]
    server = Server(run / "export", tmp_path_factory.mktemp("serve"), *flags)
    yield server, run, texts, amptrain.predict(str(run / "export"), texts)
    server.stop()


def assert_classified(predictions, records, labels):
    assert [p["label"] for p in predictions] == [r["label"] for r in records]
    for p, r in zip(predictions, records):
        assert p["probabilities"] == pytest.approx([r["probabilities"][name] for name in labels], abs=1e-5)


def test_the_classifier_answers_in_rows_and_columns_as_predict(served_classifier):
    server, run, texts, records = served_classifier
    assert server.name == run.name  # --name defaults to the run folder's name
    startup = server.log.read_text()
    assert "signature serving_default: (text DT_STRING) -> " in startup and "serve_token_ids" in startup
    labels = json.loads((run / "labels.json").read_text())
    status, rows = server.predict({"instances": texts})
    assert status == 200
    assert_classified(rows["predictions"], records, labels)
    status, columns = server.predict({"inputs": {"text": texts}, "signature_name": "serving_default"})
    assert status == 200 and set(columns["outputs"]) == {"label", "probabilities"}
    by_row = [{k: columns["outputs"][k][i] for k in columns["outputs"]} for i in range(len(texts))]
    assert_classified(by_row, records, labels)
    status, one = server.predict({"instances": [{"text": texts[0]}]}, f"/v1/models/{server.name}/versions/1:predict")
    assert status == 200 and one["predictions"][0]["label"] == records[0]["label"]
    status, metadata = server.call(f"/v1/models/{server.name}/metadata")
    assert status == 200 and metadata["model_spec"]["version"] == "1"
    assert metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["text"]["dtype"] == (
        "DT_STRING"
    )
    assert server.call("/healthz") == (200, {"status": "ready", "model": server.name, "version": 1})


def test_50_concurrent_requests_each_get_their_own_answer(served_classifier):
    server, run, texts, records = served_classifier
    labels = json.loads((run / "labels.json").read_text())
    slices = [(i % len(texts), i % len(texts) + 1 + i % 3) for i in range(50)]  # 1 to 3 texts each
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda s: server.predict({"instances": texts[s[0] : s[1]]}), slices))
    for (start, stop), (status, answer) in zip(slices, answers):
        assert status == 200
        assert_classified(answer["predictions"], records[start:stop], labels)
    assert model_calls(server) < 50  # requests shared model calls (the counts also hold the earlier tests' calls)


BAD_BODIES = [
    b"this is not JSON",
    b'{"instance": ["wrong field name"]}',
    b'{"instances": [1, 2]}',
    b'{"instances": ["\xff\xfe invalid UTF-8"]}',
    b'{"instances": ["' + b"a" * (10 << 20) + b'"]}',  # 10 MB
    json.dumps({"instances": ["a"] * 100_000}).encode(),
    b"[" * 200_000 + b"]" * 200_000,  # deeply nested
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=["not-json", "field", "numbers", "utf8", "10MB", "100k", "nested"])
def test_a_bad_input_is_a_4xx_and_the_server_answers_after(served_classifier, body):
    server, _, texts, records = served_classifier
    status, answer = server.predict(body)
    assert 400 <= status < 500 and set(answer) == {"error"} and "\n" not in answer["error"]
    status, good = server.predict({"instances": texts[:1]})
    assert status == 200 and good["predictions"][0]["label"] == records[0]["label"]


def test_a_text_no_utf8_can_carry_fails_its_own_request_and_no_other(served_classifier):
    """A lone surrogate is valid JSON but no UTF-8 text: once it joined the shared batch and
    failed the call for every request in it."""
    server, _, texts, records = served_classifier
    bodies = [{"instances": texts[:1]}] * 10 + [b'{"instances": ["spam \\ud800 spam"]}']
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(server.predict, bodies))
    (bad_status, bad), good = answers[-1], answers[:-1]
    assert bad_status == 400 and bad["error"].startswith("instances[0] holds U+D800 at character 5")
    assert [status for status, _ in good] == [200] * 10
    assert all(answer["predictions"][0]["label"] == records[0]["label"] for _, answer in good)


def test_the_token_ids_signature_answers_as_in_process(served_classifier):
    import tensorflow as tf

    server, run, *_ = served_classifier
    ids = random_ids((3, 9))
    signature = tf.saved_model.load(str(run / "export" / "1")).signatures["serve_token_ids"]
    expected = signature(token_ids=tf.constant(ids))["probabilities"].numpy()
    body = {"signature_name": "serve_token_ids", "instances": [{"token_ids": row} for row in ids.tolist()]}
    status, answer = server.predict(body, f"/v1/models/{server.name}/versions/1:predict")
    assert status == 200
    got = [p["probabilities"] for p in answer["predictions"]]
    assert abs(np.array(got) - expected).max() <= 1e-5
    ragged = {"signature_name": "serve_token_ids", "inputs": {"token_ids": [[2, 5], [2]]}}
    assert server.predict(ragged)[0] == 400


def test_a_wrong_method_an_id_out_of_range_and_a_slow_client_are_one_line_each(served_classifier):
    import socket

    server, *_ = served_classifier
    status, answer = server.call(f"/v1/models/{server.name}:predict")  # a GET
    assert status == 405 and answer["error"].endswith("predict takes POST with a JSON body, not GET")
    body = {"signature_name": "serve_token_ids", "instances": [{"token_ids": [2, 99999]}]}
    status, answer = server.predict(body)
    assert status == 400 and re.fullmatch(
        r"id 99999 at \[0,1\] is out of range: expected 0 <= id < \d+", answer["error"]
    )
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as slow:  # headers never finished
        slow.sendall(b"POST /v1/models/x:predict HTTP/1.1\r\nHost: x\r\n")
        assert slow.recv(100) == b""  # closed after --header-timeout 2
    with socket.create_connection((host, int(port)), timeout=30) as slow:  # a body that stops
        head = f"POST /v1/models/{server.name}:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        slow.sendall(head.encode() + b'{"instances": [')
        assert slow.recv(1000).startswith(b"HTTP/1.1 408 ")
    log = server.log.read_text()
    assert "Traceback" not in log, log[-2000:]


def test_unknown_models_and_versions_are_404(served_classifier):
    server, *_ = served_classifier
    assert server.predict({"instances": ["a"]}, "/v1/models/other:predict")[0] == 404
    assert server.predict({"instances": ["a"]}, f"/v1/models/{server.name}/versions/9:predict")[0] == 404


def test_a_new_version_folder_is_picked_up(served_classifier):
    server, run, texts, _ = served_classifier
    amptrain.export(str(run), version=2, checkpoint="latest")
    deadline = time.monotonic() + 60
    while (status := server.call(f"/v1/models/{server.name}"))[1]["model_version_status"][-1]["version"] != "2":
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert server.call("/healthz")[1]["version"] == 2
    assert server.predict({"instances": texts[:2]})[0] == 200
    assert server.predict({"instances": texts[:2]}, f"/v1/models/{server.name}/versions/1:predict")[0] == 200


def test_a_removed_version_is_unloaded_and_a_broken_one_named_once(served_classifier):
    """What is on disk is served: `rm -rf export/2` moves the default back to 1, and 2 is no
    longer listed. A version folder that does not load is named once in the log, keeps the
    default where it was, and its own URL is a 404 of one line."""
    import shutil

    server, run, texts, records = served_classifier
    if not (run / "export" / "2").exists():
        amptrain.export(str(run), version=2, checkpoint="latest")
    shutil.rmtree(run / "export" / "2")
    deadline = time.monotonic() + 60
    while [s["version"] for s in server.call(f"/v1/models/{server.name}")[1]["model_version_status"]] != ["1"]:
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.5)
    assert server.call("/healthz")[1]["version"] == 1
    status, answer = server.predict({"instances": texts[:1]})
    assert status == 200 and answer["predictions"][0]["label"] == records[0]["label"]
    assert server.predict({"instances": ["a"]}, f"/v1/models/{server.name}/versions/2:predict")[0] == 404
    broken = run / "export" / "3"
    shutil.copytree(run / "export" / "1", broken)
    (broken / "saved_model.pb").write_bytes((broken / "saved_model.pb").read_bytes()[:100])  # truncated
    time.sleep(3)  # three polls
    log = server.log.read_text()
    assert log.count(f"{broken}: cannot load this SavedModel") == 1, log[-2000:]
    assert "Traceback" not in log and server.call("/healthz")[1]["version"] == 1
    status, answer = server.predict({"instances": ["a"]}, f"/v1/models/{server.name}/versions/3:predict")
    assert status == 404 and answer["error"].startswith("version 3 is not available: ") and "\n" not in answer["error"]
    shutil.rmtree(broken)


def model_calls(server):
    """How many model calls the server has made (its /metrics)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        return float(re.search(r"^amptrain_serve_batch_texts_count (\S+)", response.read().decode(), re.M).group(1))


def serve_and_compare(run, folder, texts, check):
    """Starts a server on `run`'s export; `check(predictions, records)` for rows, columns,
    and 50 concurrent requests of one text each; returns the server, still running, and
    those 50 answers' predictions."""
    amptrain.export(str(run))
    records = amptrain.predict(str(run / "export"), texts)
    server = Server(run / "export", folder)
    status, rows = server.predict({"instances": texts})
    assert status == 200
    check(rows["predictions"], records)
    status, columns = server.predict({"inputs": texts})
    assert status == 200
    by_row = columns["outputs"]  # one output (the translator's): its values, as in rows
    if isinstance(by_row, dict):
        by_row = [{k: v[i] for k, v in by_row.items()} for i in range(len(texts))]
    assert by_row == rows["predictions"]
    picks = [i % len(texts) for i in range(50)]
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda i: server.predict({"instances": [texts[i]]}), picks))
    assert all(status == 200 for status, _ in answers)
    for i, (_, answer) in zip(picks, answers):
        check(answer["predictions"], records[i : i + 1])
    return server, [answer["predictions"][0] for _, answer in answers]


def test_the_tagger_answers_as_predict(tagger, tmp_path):  # noqa: F811
    run, texts = tagger

    def check(predictions, records):
        assert len(predictions) == len(records)
        for p, r in zip(predictions, records):
            n, e = p["num_words"], p["num_entities"]
            assert p["words"][:n] == r["tokens"] and p["tags"][:n] == r["tags"]
            spans = zip(*(p[k][:e] for k in ("entity_types", "entity_texts", "entity_starts", "entity_ends")))
            assert [dict(zip(("type", "text", "start", "end"), s)) for s in spans] == r["entities"]

    server, alone = serve_and_compare(run, tmp_path, texts, check)
    # Batched with others, a request of one text keeps its own padding: none.
    assert all(len(p["words"]) == p["num_words"] and len(p["entity_texts"]) == p["num_entities"] for p in alone)
    assert sum(p["num_entities"] for p in alone) > 0
    assert server.stop() == 0


def test_the_translator_answers_as_predict_and_sigterm_loses_no_request(translator, tmp_path):  # noqa: F811
    run, texts = translator

    def check(predictions, records):
        assert predictions == [r["translation"] for r in records]  # one output: the values alone

    server, _ = serve_and_compare(run, tmp_path, texts, check)
    expected = server.predict({"instances": texts})[1]["predictions"] * 16  # a text's answer is its own

    def timed(body):
        return *server.predict(body), time.monotonic()

    calls = model_calls(server)
    with ThreadPoolExecutor(12) as pool:
        flying = [pool.submit(timed, {"instances": texts * 16}) for _ in range(12)]  # 2,880 texts, 32 a call
        while model_calls(server) == calls:  # the model has started on them
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        answers = [f.result() for f in flying]
    assert server.process.wait(timeout=60) == 0
    assert all((status, answer) == (200, {"predictions": expected}) for status, answer, _ in answers)
    assert max(done for *_, done in answers) > signalled  # some were still in the model at the signal
    assert "every request in flight was answered" in server.log.read_text()
