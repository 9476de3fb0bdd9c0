"""The official `anthropic` Python client against a running `tinyllm-native serve`.

The client (2.x) no longer takes `temperature` as an argument; greedy decoding, which makes the
whole and streamed answers comparable, goes in `extra_body` (the Messages API still has it).

Run by `native/tests/server.rs` as
    python3 server_anthropic.py BASE_URL real       # the real Qwen model: text, tools, count_tokens
    python3 server_anthropic.py BASE_URL thinking   # the thinking fixture: a thinking block
(BASE_URL ends in /v1, as for the openai client; the anthropic client adds it itself.)
Exits non-zero with the failing check on stderr.
"""

import sys

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def streamed(client, **kw):
    """The final message of a streamed request, and the event types seen."""
    kinds = []
    with client.messages.stream(**kw) as stream:
        for event in stream:
            kinds.append(event.type)
        return stream.get_final_message(), kinds


def real(client):
    model = "qwen"
    question = [{"role": "user", "content": "Say hello in French, in one short sentence."}]
    whole = client.messages.create(model=model, max_tokens=24, extra_body={"temperature": 0}, messages=question,
                                   system="You are a helpful assistant.")
    assert whole.type == "message" and whole.role == "assistant", whole
    assert whole.stop_reason in ("end_turn", "max_tokens"), whole
    assert whole.content and whole.content[0].type == "text" and text_of(whole), whole
    assert whole.usage.output_tokens > 0, whole.usage
    final, kinds = streamed(client, model=model, max_tokens=24, extra_body={"temperature": 0}, messages=question,
                            system="You are a helpful assistant.")
    assert text_of(final) == text_of(whole), (text_of(final), text_of(whole))
    assert final.stop_reason == whole.stop_reason, final
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_start" in kinds and "message_delta" in kinds, kinds

    # The same conversation counted: the prompt's tokens, as the answer's usage reports them.
    counted = client.messages.count_tokens(model=model, messages=question, system="You are a helpful assistant.")
    assert counted.input_tokens == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0), (
        counted, whole.usage)

    # A stop sequence ends the answer and is named.
    stop = client.messages.create(model=model, max_tokens=24, extra_body={"temperature": 0}, messages=question,
                                  system="You are a helpful assistant.", stop_sequences=[text_of(whole)[3:6]])
    assert stop.stop_reason == "stop_sequence" and stop.stop_sequence == text_of(whole)[3:6], stop

    # A tool round trip, whole and streamed.
    ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    call = client.messages.create(model=model, max_tokens=60, extra_body={"temperature": 0}, messages=ask, tools=[WEATHER])
    assert call.stop_reason == "tool_use", call
    uses = [b for b in call.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather", call
    assert "Paris" in uses[0].input["city"], uses[0].input
    assert uses[0].id.startswith("toolu_"), uses[0]
    final, kinds = streamed(client, model=model, max_tokens=60, extra_body={"temperature": 0}, messages=ask, tools=[WEATHER])
    s_uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [u.input for u in s_uses] == [uses[0].input], final
    follow = ask + [
        {"role": "assistant", "content": [b.model_dump() for b in call.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "{\"temperature_c\": 18, \"condition\": \"sunny\"}"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=60, extra_body={"temperature": 0}, messages=follow, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens"), answer
    said = text_of(answer)
    assert "18" in said or "sunny" in said.lower(), said
    # The follow-up extends the first conversation in the same slot.
    assert (answer.usage.cache_read_input_tokens or 0) > 0, answer.usage

    # Errors in Anthropic's shape.
    try:
        client.messages.create(model=model, max_tokens=0, messages=question)
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error" and "max_tokens" in e.body["error"]["message"], e.body
    else:
        raise AssertionError("max_tokens=0 was accepted")


def thinking(client):
    ask = [{"role": "user", "content": "Think first."}]
    whole = client.messages.create(model="fixture", max_tokens=12, extra_body={"temperature": 0}, messages=ask)
    assert whole.content[0].type == "thinking" and whole.content[0].thinking, whole
    final, kinds = streamed(client, model="fixture", max_tokens=12, extra_body={"temperature": 0}, messages=ask)
    assert final.content[0].type == "thinking" and final.content[0].thinking == whole.content[0].thinking, final
    assert "content_block_delta" in kinds, kinds


def main(base_url: str, case: str) -> None:
    root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
    client = anthropic.Anthropic(base_url=root, api_key="sk-test", max_retries=0)
    {"real": real, "thinking": thinking}[case](client)
    print(f"anthropic client ({case}): ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
