"""The official `openai` Python client against a running `tinyllm-native serve`.

Run by `native/tests/server.rs` (test `openai_python_client`) as
    python3 server_openai.py BASE_URL        # e.g. http://127.0.0.1:PORT/v1
Exits non-zero with the failing check on stderr.
"""

import sys

import openai


def main(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)

    models = client.models.list()
    model = models.data[0].id
    assert model, models

    messages = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8)
    choice = whole.choices[0]
    assert choice.message.role == "assistant", whole
    assert choice.finish_reason in ("stop", "length"), whole
    assert whole.usage.completion_tokens <= 8, whole.usage
    assert whole.usage.prompt_tokens_details.cached_tokens is not None, whole.usage

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == (choice.message.content or ""), (text, choice.message.content)
    assert finish == choice.finish_reason, finish
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage

    done = client.completions.create(model=model, prompt="Once upon", max_tokens=4, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 4, done

    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "n", e.body
    else:
        raise AssertionError("n=2 was accepted")

    # Embeddings: the client asks for base64 by default and decodes it; floats when asked.
    texts = ["Hello world", "The quick brown fox"]
    got = client.embeddings.create(model=model, input=texts)
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1], got
    assert got.usage.prompt_tokens > 0 and got.usage.total_tokens == got.usage.prompt_tokens, got.usage
    for a, b in zip(got.data, floats.data):
        assert len(a.embedding) == len(b.embedding) > 0, (len(a.embedding), len(b.embedding))
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6
        norm = sum(x * x for x in a.embedding) ** 0.5
        assert abs(norm - 1.0) < 1e-4, norm
    try:
        client.embeddings.create(model=model, input="hi", dimensions=3)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "dimensions", e.body
    else:
        raise AssertionError("dimensions=3 was accepted")

    print("openai client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
