"""The official `openai` Python client reading reasoning and tool calls from a running
`tinyllm-native serve` with a scripted model (see tests/common/scripted.rs).

Run by `native/tests/server.rs` (test `openai_python_client_reads_reasoning_and_tool_calls`) as
    python3 server_openai_tools.py BASE_URL harmony|deepseek|qwen3-coder|qwen3.5
Exits non-zero with the failing check on stderr.
"""

import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time", "parameters": {"type": "object", "properties": {}}},
    },
]

# Parameters of several schema types: Qwen3-Coder's XML format writes every value as text and
# the server types it from the schema (`zip` stays a string of digits, `days` is an integer).
QWEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "zip": {"type": "string"},
                    "days": {"type": "integer"},
                    "options": {"type": "object"},
                },
                "required": ["city"],
            },
        },
    },
    TOOLS[1],
]
TOOLS_OF = {"harmony": TOOLS, "deepseek": TOOLS, "qwen3-coder": QWEN_TOOLS, "qwen3.5": QWEN_TOOLS}

# What each scripted model answers: (extra body, reasoning, content, [(name, arguments)]).
EXPECTED = {
    "harmony": [
        (
            {"chat_template_kwargs": {"reasoning_effort": "high"}},
            "The user wants the weather in Paris.",
            "Checking the weather.",
            [("get_weather", {"city": "Paris"})],
        ),
    ],
    "deepseek": [
        ({}, None, "Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
        (
            {"chat_template_kwargs": {"thinking": True}},
            "The user wants the weather.",
            "Checking.",
            [("get_weather", {"city": "Paris"})],
        ),
    ],
    "qwen3-coder": [
        (
            {},
            None,
            "Let me check.\n\n",
            [
                ("get_weather", {"city": "Paris", "zip": "75001", "days": 3, "options": {"unit": "celsius", "hourly": True}}),
                ("get_time", {}),
            ],
        ),
    ],
    "qwen3.5": [
        ({}, "The user wants the weather.\n", "Checking.\n\n", [("get_weather", {"city": "Paris", "days": 1})]),
    ],
}


def check(client, model, tools, extra, reasoning, content, calls):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    whole = client.chat.completions.create(
        model=model, messages=messages, tools=tools, temperature=0, extra_body=extra
    )
    choice = whole.choices[0]
    msg = choice.message
    assert choice.finish_reason == "tool_calls", whole
    assert msg.content == content, msg
    # `reasoning_content` is not in the client's types; it comes through as an extra field.
    assert getattr(msg, "reasoning_content", None) == reasoning, msg
    got = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
    assert got == calls, got
    assert all(c.id.startswith("call_") and c.type == "function" for c in msg.tool_calls), msg.tool_calls

    stream = client.chat.completions.create(
        model=model, messages=messages, tools=tools, temperature=0, stream=True, extra_body=extra
    )
    text, thought, finish, parts = "", "", None, {}
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            thought += getattr(c.delta, "reasoning_content", None) or ""
            for d in c.delta.tool_calls or []:
                p = parts.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                p["id"] += d.id or ""
                if d.function is not None:
                    p["name"] += d.function.name or ""
                    p["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert text == (content or ""), text
    assert thought == (reasoning or ""), thought
    assert finish == "tool_calls", finish
    streamed = [(parts[i]["name"], json.loads(parts[i]["arguments"])) for i in sorted(parts)]
    assert streamed == calls, streamed
    assert all(p["id"].startswith("call_") for p in parts.values()), parts

    # The round trip: the client's own message object goes back with the results.
    follow = messages + [msg.model_dump(exclude_none=True)]
    for c in msg.tool_calls:
        follow.append({"role": "tool", "tool_call_id": c.id, "content": "{\"temperature_c\": 18}"})
    again = client.chat.completions.create(model=model, messages=follow, tools=tools, temperature=0, extra_body=extra)
    assert again.choices[0].finish_reason in ("stop", "tool_calls"), again


def main(base_url: str, family: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    model = client.models.list().data[0].id
    for case in EXPECTED[family]:
        check(client, model, TOOLS_OF[family], *case)
    print(f"openai client ({family}): ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
