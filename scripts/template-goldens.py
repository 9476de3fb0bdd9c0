#!/usr/bin/env python3
"""Renders the chat templates in tests/golden/templates/*.jinja with Python's jinja2, set up the
way Hugging Face transformers renders chat templates, into tests/golden/templates/jinja2.jsonl:
the reference `tests/template_golden.rs` compares our minijinja renderer with byte for byte.

    python3 scripts/template-goldens.py          # rewrites the golden file

Inputs are prepared as tinyllm's server prepares them (and llama.cpp's /apply-template):
tool-call `arguments` sent as JSON strings are parsed into objects before rendering.
`strftime_now` dates are written as `Current date: DATE` so the file does not age; the test
replaces today's date the same way.
"""

import copy
import json
import pathlib
import re
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "golden" / "templates"


def environment() -> jinja2.Environment:
    # transformers' `_compile_jinja_template` (utils/chat_template_utils.py).
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}},
}

# Parameters of several schema types, for the formats that write each value as text.
TYPED = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "mode": {"type": "integer"},
                "meta": {"type": "object"},
                "content": {"type": "string"},
            },
            "required": ["path", "content"],
        },
    },
}
USER_Q = {"role": "user", "content": "What is the weather like in Paris?"}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"},
        }
    ],
}
TYPED_CALL = {
    "role": "assistant",
    "content": "Writing it.",
    "tool_calls": [
        {
            "id": "call_2",
            "type": "function",
            "function": {
                "name": "write_file",
                "arguments": json.dumps(
                    {"path": "a.py", "mode": 420, "meta": {"tags": ["x", "y"]}, "content": "def f():\n    return 1\n"}
                ),
            },
        }
    ],
}
THOUGHT_CALL = {k: v for k, v in CALL.items() if k != "content"} | {"thinking": "Need the weather tool."}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 18, \"condition\": \"sunny\"}"}
ROUND_TRIP = [USER_Q, CALL, RESULT]
HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! Ünïcode ✓"},
    {"role": "user", "content": "Name a colour."},
]

# template file, bos, eos, cases: (name, messages, tools, kwargs, add_generation_prompt)
TEMPLATES = [
    (
        "openai-gpt-oss-120b.jinja",
        "<|startoftext|>",
        "<|return|>",
        [
            ("user_only", [{"role": "user", "content": "Hello"}], None, {}, True),
            ("history_effort_high", HISTORY, None, {"reasoning_effort": "high"}, True),
            ("tools_effort_low", [USER_Q], [WEATHER, TIME], {"reasoning_effort": "low"}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER, TIME], {"reasoning_effort": "medium"}, True),
            # What llama.cpp hands the template when the client sends `reasoning_content` back:
            # `thinking`, and no `content` next to tool calls (tests/template_golden.rs checks
            # that our renderer does the same from `reasoning_content`).
            ("tool_round_trip_thinking", [USER_Q, THOUGHT_CALL, RESULT], [WEATHER], {}, True),
            (
                "identity_builtin_browser_no_prompt",
                HISTORY[:3],
                None,
                {"model_identity": "You are Tiny.", "builtin_tools": ["browser"]},
                False,
            ),
        ],
    ),
    (
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        [
            ("history", HISTORY, None, {}, True),
            ("thinking", [USER_Q], None, {"thinking": True}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER], {}, True),
            ("tool_round_trip_answered", ROUND_TRIP + [{"role": "assistant", "content": "Sunny, 18 C."}, {"role": "user", "content": "Thanks"}], [WEATHER], {}, True),
        ],
    ),
    (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        [
            ("history", HISTORY, None, {}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER], {}, True),
        ],
    ),
    (
        "GLM-4.6.jinja",
        "",
        "",
        [
            ("history", HISTORY, None, {}, True),
            ("tools_no_thinking", [USER_Q], [WEATHER, TIME], {"enable_thinking": False}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER], {}, True),
        ],
    ),
    (
        "Qwen3-Coder.jinja",
        "",
        "<|im_end|>",
        [
            # No tools: the template asks `tools is iterable` of None.
            ("history", HISTORY, None, {}, True),
            ("tools", [USER_Q], [WEATHER, TIME], {}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER], {}, True),
            ("tool_round_trip_typed", [USER_Q, TYPED_CALL, RESULT], [WEATHER, TYPED], {}, True),
        ],
    ),
    (
        "Qwen3.5-4B.jinja",
        "",
        "<|im_end|>",
        [
            ("history", HISTORY, None, {}, True),
            ("tools_no_thinking", [USER_Q], [WEATHER, TIME], {"enable_thinking": False}, True),
            ("tool_round_trip", ROUND_TRIP, [WEATHER], {}, True),
            ("tool_round_trip_typed", [USER_Q, TYPED_CALL, RESULT], [WEATHER, TYPED], {}, True),
        ],
    ),
]


def prepared(messages):
    """Tool-call arguments parsed into objects, as tinyllm and llama.cpp do before rendering."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for call in m.get("tool_calls") or []:
            f = call.get("function", call)
            if isinstance(f.get("arguments"), str):
                try:
                    f["arguments"] = json.loads(f["arguments"])
                except json.JSONDecodeError:
                    pass
    return messages


def main() -> None:
    env = environment()
    rows = []
    for file, bos, eos, cases in TEMPLATES:
        template = env.from_string((DIR / file).read_text())
        for name, messages, tools, kwargs, gen in cases:
            rendered = template.render(
                messages=prepared(messages),
                tools=tools,
                add_generation_prompt=gen,
                bos_token=bos,
                eos_token=eos,
                **kwargs,
            )
            rendered = re.sub(r"Current date: \d{4}-\d{2}-\d{2}", "Current date: DATE", rendered)
            rows.append(
                {
                    "template": file,
                    "name": name,
                    "bos_token": bos,
                    "eos_token": eos,
                    "messages": messages,
                    "tools": tools,
                    "kwargs": kwargs,
                    "add_generation_prompt": gen,
                    "rendered": rendered,
                }
            )
    out = DIR / "jinja2.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} renderings -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
