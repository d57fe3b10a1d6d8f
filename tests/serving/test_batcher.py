"""Batching across requests (serving/batcher.py), with a plain Python function as the model:
concurrent requests share a call up to the batch size, each gets its own rows back (and
its own padding), a request larger than the batch runs alone, an error reaches the request
that caused it and no other."""

import asyncio
import threading

import numpy as np
import pytest

from amptrain.serving.batcher import Batcher, own_rows
from amptrain.tasks.ner.serving import TaggerModule


class Model:
    """Upper-cases texts; records each call's texts and the thread it ran in."""

    def __init__(self, seconds=0.0):
        self.calls, self.threads, self.seconds = [], set(), seconds

    def __call__(self, texts):
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if self.seconds:
            threading.Event().wait(self.seconds)
        return {
            "upper": np.array([t.upper() for t in texts], dtype=object),
            "length": np.array([len(t) for t in texts]),
        }


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_one_call_and_get_their_own_rows():
    model = Model()

    async def main():
        batcher = Batcher(model, max_batch_size=32, max_wait_ms=50)
        requests = [[f"r{i}a", f"r{i}b"] for i in range(5)]
        answers = await asyncio.gather(*(batcher.predict(texts) for texts in requests))
        await batcher.close()
        return requests, answers

    requests, answers = run(main())
    assert len(model.calls) == 1 and len(model.calls[0]) == 10
    for texts, answer in zip(requests, answers):
        assert answer["upper"].tolist() == [t.upper() for t in texts]
    assert model.threads and "MainThread" not in model.threads  # off the event loop


def test_a_batch_stops_at_the_batch_size_and_the_rest_waits_for_the_next():
    model = Model(seconds=0.05)

    async def main():
        batcher = Batcher(model, max_batch_size=4, max_wait_ms=20)
        answers = await asyncio.gather(*(batcher.predict([str(i), str(i)]) for i in range(5)))
        await batcher.close()
        return answers

    answers = run(main())
    assert [len(call) for call in model.calls] == [4, 4, 2]
    assert [a["upper"].tolist() for a in answers] == [[str(i)] * 2 for i in range(5)]


def test_a_request_larger_than_the_batch_runs_alone_in_one_call():
    model = Model()

    async def main():
        batcher = Batcher(model, max_batch_size=2, max_wait_ms=10)
        small, large = await asyncio.gather(batcher.predict(["x"]), batcher.predict(list("abcde")))
        await batcher.close()
        return small, large

    small, large = run(main())
    assert sorted(len(c) for c in model.calls) == [1, 5] and large["upper"].tolist() == list("ABCDE")


def test_an_error_reaches_only_the_request_that_caused_it_and_the_next_call_works():
    calls = []

    def failing(texts):
        calls.append(list(texts))
        if "boom" in texts:
            raise RuntimeError("the model failed")
        return {"length": np.array([len(t) for t in texts])}

    async def main():
        batcher = Batcher(failing, max_batch_size=8, max_wait_ms=20)
        results = await asyncio.gather(
            batcher.predict(["ok"]), batcher.predict(["boom"]), batcher.predict(["fine!"]), return_exceptions=True
        )
        after = await batcher.predict(["fine"])
        await batcher.close()
        return results, after

    (ok, boom, fine), after = run(main())
    assert isinstance(boom, RuntimeError) and ok["length"].tolist() == [2] and fine["length"].tolist() == [5]
    # one shared call failed, then each request alone: only "boom" failed again
    assert calls[:4] == [["ok", "boom", "fine!"], ["ok"], ["boom"], ["fine!"]] and after["length"].tolist() == [4]


def test_a_request_keeps_its_own_padding():
    fill = ""
    outputs = {
        "words": np.array([["a", "b", fill], ["c", fill, fill], ["d", "e", "f"]], dtype=object),
        "word_starts": np.array([[0, 2, -1], [0, -1, -1], [0, 2, 4]]),
        "num_words": np.array([2, 1, 3]),
        "entity_texts": np.array([["a", fill], [fill, fill], ["d", "e f"]], dtype=object),
        "num_entities": np.array([1, 0, 2]),
    }
    padded_by = TaggerModule.padded_by  # the tagger's
    first = own_rows(outputs, 0, 2, padded_by)  # as the two would come back unbatched: 2 words, 1 entity wide
    assert first["words"].tolist() == [["a", "b"], ["c", fill]] and first["word_starts"].shape == (2, 2)
    assert first["entity_texts"].tolist() == [["a"], [fill]]
    assert own_rows(outputs, 1, 2, padded_by)["entity_texts"].shape == (1, 0)
    assert own_rows(outputs, 2, 3, padded_by)["words"].tolist() == [["d", "e", "f"]]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_batch_size 0"):
        Batcher(Model(), max_batch_size=0)
