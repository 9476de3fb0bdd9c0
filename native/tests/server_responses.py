"""The official `openai` Python client's Responses API against a running `tinyllm-native serve`.

Run by `native/tests/server.rs` as
    python3 server_responses.py BASE_URL real       # the real Qwen model (--responses-store 2)
    python3 server_responses.py BASE_URL thinking   # the thinking fixture: a reasoning item
Exits non-zero with the failing check on stderr.
"""

import json
import sys

import openai

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}


def stream_text(client, **kw):
    """The streamed text, the event types, and the final response."""
    text, kinds, final = "", [], None
    for event in client.responses.create(stream=True, **kw):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    return text, kinds, final


def real(client):
    model = client.models.list().data[0].id
    hello = dict(model=model, input="Say hello in French, in one short sentence.", max_output_tokens=24,
                 temperature=0, instructions="You are a helpful assistant.")
    whole = client.responses.create(**hello)
    assert whole.object == "response" and whole.status in ("completed", "incomplete"), whole
    assert whole.output_text, whole
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0, whole.usage
    text, kinds, final = stream_text(client, store=False, **hello)
    assert text == whole.output_text, (text, whole.output_text)
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds, kinds
    assert final.output_text == whole.output_text, final

    # A tool round trip: by sending the items back, and by previous_response_id.
    ask = "What is the weather like in Paris right now?"
    call = client.responses.create(model=model, input=ask, tools=[WEATHER], temperature=0, max_output_tokens=60)
    calls = [o for o in call.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", call.output
    assert "Paris" in json.loads(calls[0].arguments)["city"], calls[0]
    _, kinds, streamed = stream_text(client, model=model, input=ask, tools=[WEATHER], temperature=0,
                                     max_output_tokens=60, store=False)
    s_calls = [o for o in streamed.output if o.type == "function_call"]
    assert [c.arguments for c in s_calls] == [calls[0].arguments], streamed.output
    assert "response.function_call_arguments.delta" in kinds, kinds
    result = {"type": "function_call_output", "call_id": calls[0].call_id,
              "output": "{\"temperature_c\": 18, \"condition\": \"sunny\"}"}
    items = [{"role": "user", "content": ask}] + [c.model_dump(exclude_none=True) for c in calls] + [result]
    answer = client.responses.create(model=model, input=items, tools=[WEATHER], temperature=0, max_output_tokens=60,
                                     store=False)
    said = answer.output_text
    assert "18" in said or "sunny" in said.lower(), said
    chained = client.responses.create(model=model, previous_response_id=call.id, input=[result], tools=[WEATHER],
                                      temperature=0, max_output_tokens=60)
    assert chained.output_text == said, (chained.output_text, said)

    # Structured output under a JSON schema.
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    shaped = client.responses.create(model=model, input="Name a city in Japan and its country.", temperature=0,
                                     max_output_tokens=60,
                                     text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                                      "strict": True}})
    place = json.loads(shaped.output_text)
    assert set(place) == {"city", "country"} and all(isinstance(v, str) for v in place.values()), place

    # Stored responses: retrieve, delete, and the store's bound (--responses-store 2 here).
    got = client.responses.retrieve(shaped.id)
    assert got.id == shaped.id and got.output_text == shaped.output_text, got
    deleted = client.responses.delete(shaped.id)
    try:
        client.responses.retrieve(shaped.id)
    except openai.NotFoundError as e:
        assert shaped.id in str(e.body), e.body
    else:
        raise AssertionError("a deleted response was still there")
    for _ in range(2):
        client.responses.create(model=model, input="Hi", max_output_tokens=2, temperature=0)
    try:
        client.responses.create(model=model, input="And then?", previous_response_id=call.id, max_output_tokens=2)
    except openai.NotFoundError as e:
        assert e.body["param"] == "previous_response_id" and call.id in e.body["message"], e.body
    else:
        raise AssertionError("an evicted previous_response_id was accepted")
    del deleted


def thinking(client):
    model = client.models.list().data[0].id
    r = client.responses.create(model=model, input="Think first.", max_output_tokens=12, temperature=0)
    assert r.output[0].type == "reasoning", r.output
    assert r.output[0].content[0].text, r.output[0]
    kinds = [e.type for e in client.responses.create(model=model, input="Think first.", max_output_tokens=12,
                                                      temperature=0, stream=True)]
    assert "response.reasoning_text.delta" in kinds, kinds


def main(base_url: str, case: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    {"real": real, "thinking": thinking}[case](client)
    print(f"openai responses ({case}): ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
