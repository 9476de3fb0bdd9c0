#!/usr/bin/env python3
"""Time to first token of a chat's second turn through `tinyllm-native serve`: cold (a fresh
server gets the second turn alone) against reused (the same server answered the first turn, so
its slot holds the prefix: the KV cache on dense models; on hybrid models the recurrent state,
live or from a checkpoint).

    scripts/second-turn-ttft.py MODEL [--exe PATH] [--words N] [--threads T] [--reps R]

The conversation: a first turn whose user message has about N words, answered with 16 greedy
tokens; then a second turn that sends the history back with a new question, either as it was
(the slot's live state continues it) or with the answer edited (as clients and templates do
when they drop reasoning): the history then leaves the evaluated tokens inside the answer, and
a hybrid model resumes from its checkpoint at the end of the first prompt. Each time is from
the request to the first streamed content byte; the server's usage says how many prompt tokens
it reused. Needs `pip install openai`.
"""

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(exe, model, threads, extra):
    port = free_port()
    cmd = [exe, "serve", "-m", model, "--port", str(port), "--parallel", "1", "--ctx", "8192",
           "--threads", str(threads), *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    for _ in range(600):
        try:
            client.models.list()
            return p, client
        except Exception:
            if p.poll() is not None:
                sys.exit(f"{' '.join(cmd)} exited with {p.returncode}")
            time.sleep(0.2)
    p.kill()
    sys.exit("the server did not come up")


def turn(client, messages):
    """(seconds to the first content chunk, whole text, usage) of one streamed request."""
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    stream = client.chat.completions.create(
        model="m", messages=messages, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                text += c.delta.content
    return first, text, usage


def turns(words, answer, edited):
    body = " ".join(f"item{i} is filed under shelf {i % 17} in room {i % 5}." for i in range(words // 8))
    first = [{"role": "user", "content": f"Remember these notes: {body} Which room holds item3?"}]
    if answer is None:
        return first, None
    said = "(answer withheld)" if edited else answer
    return first, first + [
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And which shelf holds item7?"},
    ]


def cached(u):
    d = getattr(u, "prompt_tokens_details", None)
    return getattr(d, "cached_tokens", None) if d else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--exe", default=os.environ.get("TINYLLM", str(Path.home() / ".cache/tinyllm/target/release/tinyllm-native")))
    ap.add_argument("--words", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    p, client = start(a.exe, a.model, a.threads, [])
    try:
        first, _ = turns(a.words, None, False)
        _, answer, _ = turn(client, first)
    finally:
        p.terminate()
        p.wait()
    best = {}
    for _ in range(a.reps):
        for name, warm, edited in [("cold", False, False), ("reused", True, False), ("edited", True, True)]:
            p, client = start(a.exe, a.model, a.threads, [])
            try:
                first, second = turns(a.words, answer, edited)
                if warm:
                    turn(client, first)
                r = turn(client, second)
            finally:
                p.terminate()
                p.wait()
            if name not in best or r[0] < best[name][0]:
                best[name] = r
    for name, (ttft, _, u) in best.items():
        print(f"{name:>6}: second-turn ttft {ttft:.3f} s, prompt {u.prompt_tokens} tokens, {cached(u)} reused")
    cold = best["cold"][0]
    print(f"cold / reused: {cold / best['reused'][0]:.1f}x, cold / edited: {cold / best['edited'][0]:.1f}x")


if __name__ == "__main__":
    main()
