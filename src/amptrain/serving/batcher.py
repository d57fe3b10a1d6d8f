"""Batching across requests, as TF Serving's batching does: the texts of concurrent requests
go into one model call, up to `max_batch_size` texts or `max_wait_ms` after the first came.

    batcher = Batcher(run, max_batch_size=32, max_wait_ms=5)   # run(texts) -> {name: array}
    outputs = await batcher.predict(["see you at lunch"])        # this request's rows only
    await batcher.close()

`run` is called in one worker thread, never on the event loop (the server keeps reading and
answering requests while the model runs; TensorFlow's own threads use the cores), and one
call at a time: requests that come while it runs make the next batch. A request of more
texts than `max_batch_size` is never split: it runs alone, in one call. A call that fails is
made again a request at a time, so that only the request that failed it gets the error. Each request gets
its own rows back, and its own padding: the tagger pads a batch's words and entities to the
batch's most (`padded_by`: its serving module's), and `own_rows` cuts a request's rows back
to its own most, so that a response never depends on what it was batched with.
"""

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass
class _Waiting:
    texts: list
    future: asyncio.Future
    arrived: float  # the event loop's time


class Batcher:
    def __init__(self, run, max_batch_size=32, max_wait_ms=5.0, on_batch=None, padded_by=None):
        if max_batch_size < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch_size {max_batch_size}, max_wait_ms {max_wait_ms}: expected >= 1 and >= 0")
        self.max_batch_size, self.max_wait = max_batch_size, max_wait_ms / 1000
        self._run, self._on_batch = run, on_batch  # on_batch(texts in the call, seconds it took)
        self._padded_by = padded_by or {}  # {count output: padded outputs} (`ServingModule.padded_by`)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="amptrain-model")
        self._pending, self._pending_texts = collections.deque(), 0
        self._busy = False  # a batch's call is running
        self._alone = 0  # calls of `run_alone` running or waiting
        self._arrived = self._collector = None  # made on the event loop, at the first request

    async def predict(self, texts):
        """This request's outputs {name: array, a row a text}, from a call shared with
        the requests that came at the same time."""
        loop = asyncio.get_running_loop()
        if self._collector is None:
            self._arrived = asyncio.Event()
            self._collector = loop.create_task(self._collect())
        waiting = _Waiting(list(texts), loop.create_future(), loop.time())
        self._pending.append(waiting)
        self._pending_texts += len(waiting.texts)
        self._arrived.set()
        return await waiting.future

    async def run_alone(self, function, *args):
        """`function(*args)` in the model's worker thread, batched with nothing (a token-ids
        request: its rows' lengths are its own)."""
        self._alone += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, function, *args)
        finally:
            self._alone -= 1

    async def close(self):
        """Answers the requests waiting or in the model, then stops collecting and the
        worker thread."""
        while self._pending or self._busy or self._alone:
            await asyncio.sleep(0.01)
        if self._collector is not None:
            self._collector.cancel()
            await asyncio.gather(self._collector, return_exceptions=True)
        self._worker.shutdown(wait=True)

    async def _collect(self):
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            # The wait counts from the first request's arrival (TF Serving's batch_timeout_micros):
            # one that came while the model ran has waited already.
            deadline = self._pending[0].arrived + self.max_wait
            while self._pending_texts < self.max_batch_size and loop.time() < deadline:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            await self._call(self._take(), loop)

    def _take(self):
        """The first pending request, and those after it while their texts fit the batch."""
        batch, size = [], 0
        while self._pending and (not batch or size + len(self._pending[0].texts) <= self.max_batch_size):
            waiting = self._pending.popleft()
            batch.append(waiting)
            size += len(waiting.texts)
        self._pending_texts -= size
        return batch

    async def _call(self, batch, loop):
        texts = [text for waiting in batch for text in waiting.texts]
        started, self._busy = time.monotonic(), True
        try:
            outputs = await loop.run_in_executor(self._worker, self._run, texts)
        except Exception as error:
            if len(batch) > 1:  # one request may have failed the call: each alone, each its own answer
                self._busy = False
                for waiting in batch:
                    await self._call([waiting], loop)
                return
            for waiting in batch:  # the request gets its error (the server: a 500)
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            return
        finally:
            self._busy = False
        if self._on_batch is not None:
            self._on_batch(len(texts), time.monotonic() - started)
        start = 0
        for waiting in batch:
            stop = start + len(waiting.texts)
            if not waiting.future.done():  # a client that went away leaves a cancelled future
                waiting.future.set_result(own_rows(outputs, start, stop, self._padded_by))
            start = stop


def own_rows(outputs, start, stop, padded_by):
    """Rows `start:stop` of a batch's outputs, each padded output cut to those rows' most
    (`padded_by`: {count output: the outputs it pads})."""
    rows = {name: array[start:stop] for name, array in outputs.items()}
    for count, padded in padded_by.items():
        if count in rows:
            width = int(rows[count].max()) if len(rows[count]) else 0
            for name in padded:
                if name in rows:
                    rows[name] = rows[name][:, :width]
    return rows
