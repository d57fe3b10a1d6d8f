"""`amptrain serve`'s OpenAI API under the official `openai` client: time to the first piece
and pieces a second of one streamed greedy chat, and the wall time of N chats sent at once,
against a server already running (`amptrain serve pretrained/SmolLM2-135M-Instruct`).

    .venv/bin/python benchmarks/serve_openai.py http://127.0.0.1:8501/v1 [--rounds 5] [--tokens 64] [--clients 16]

Each round streams one chat of --tokens new pieces at most (the first chunk's arrival is the
time to the first piece; pieces/s counts the completion's pieces over the time after it), then
sends --clients chats of the same length at once from threads; medians over the rounds.
Prints the CPU and /proc/loadavg at the start and end (the server shares the machine).
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def cpu():
    with open("/proc/cpuinfo") as f:
        name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return f"{name} ({', '.join(f for f in ('avx2', 'avx512_bf16', 'amx_bf16') if f in flags)})"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def streamed(client, model, tokens):
    """(seconds to the first piece, pieces/s after it, pieces) of one streamed greedy chat."""
    started = time.perf_counter()
    first, usage = None, None
    chunks = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in chunks:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        usage = chunk.usage or usage
    ended = time.perf_counter()
    pieces = usage.completion_tokens
    return first - started, (pieces - 1) / max(ended - first, 1e-9), pieces


def at_once(client, model, tokens, clients):
    """(wall seconds, pieces) of `clients` greedy chats sent at once."""

    def one(i):
        messages = [{"role": "user", "content": f"{PROMPT} Number {i}."}]
        answer = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=tokens)
        return answer.usage.completion_tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        pieces = sum(pool.map(one, range(clients)))
    return time.perf_counter() - started, pieces


def main():
    import openai

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    print(f"{cpu()}; load {loadavg()}; model {model}")
    firsts, rates, walls, totals = [], [], [], []
    for round_ in range(args.rounds):
        first, rate, pieces = streamed(client, model, args.tokens)
        wall, total = at_once(client, model, args.tokens, args.clients)
        firsts.append(first)
        rates.append(rate)
        walls.append(wall)
        totals.append(total / wall)
        print(f"round {round_ + 1}: first piece {first * 1000:.0f} ms, {rate:.1f} pieces/s ({pieces} pieces); "
              f"{args.clients} at once: {wall:.1f} s, {total / wall:.1f} pieces/s", flush=True)  # fmt: skip
    print(
        f"median: first piece {statistics.median(firsts) * 1000:.0f} ms, {statistics.median(rates):.1f} pieces/s "
        f"streamed; {args.clients} at once {statistics.median(walls):.1f} s ({statistics.median(totals):.1f} "
        f"pieces/s); load {loadavg()}"
    )


if __name__ == "__main__":
    main()
