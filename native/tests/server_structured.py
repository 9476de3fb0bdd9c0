"""Structured output through the official `openai` client against `tinyllm-native serve` on a
real model: every `json_schema` answer parses and validates (the `jsonschema` package is the
judge), streamed and not; `tool_choice: "required"` calls validate against their tool's schema;
under `"auto"` a fenced or bare JSON call of a declared tool becomes a tool call and one naming
an undeclared tool stays content.

    python3 server_structured.py BASE_URL [--json-prompts N] [--tool-prompts N] [--lenient]

Prints one JSON line of counts; exits 1 on any failure (each listed on stderr).
"""

import argparse
import json
import sys

import jsonschema
import openai

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "country": {"type": "string", "maxLength": 40},
                },
                "required": ["city", "country"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
    },
    "review": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "neutral", "negative"]},
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "keywords": {
                "type": "array",
                "items": {"type": "string", "maxLength": 24},
                "minItems": 2,
                "maxItems": 5,
            },
        },
        "required": ["sentiment", "stars", "keywords"],
        "additionalProperties": False,
    },
    "inventory": {
        "type": "object",
        "properties": {
            "store": {"type": "string", "maxLength": 40},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "product": {"type": "string", "maxLength": 30},
                        "quantity": {"type": "integer", "minimum": 0, "maximum": 1000},
                        "in_stock": {"type": "boolean"},
                    },
                    "required": ["product", "quantity", "in_stock"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["store", "items"],
        "additionalProperties": False,
    },
}

SUBJECTS = [
    "Ada Lovelace, the mathematician from London",
    "a review of a coffee shop with slow service but great espresso",
    "a small bakery in Lyon that sells bread and croissants",
    "Kenji, a 34-year-old engineer living in Osaka",
    "a review of a phone whose battery died after a week",
    "a hardware store in Denver with hammers, nails and paint",
    "Maria, a retired teacher in Buenos Aires",
    "a review of a hotel with a friendly staff and a noisy street",
    "a bookshop in Oslo that stocks novels and maps",
    "Tom, a 19-year-old student in Toronto",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money between currencies",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "minimum": 0, "maximum": 1000000000},
                    "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                },
                "required": ["amount", "from", "to"],
                "additionalProperties": False,
            },
        },
    },
]

TOOL_PROMPTS = [
    "What is the weather like in Tokyo?",
    "How many euros are 250 US dollars?",
    "Is it raining in London right now?",
    "Convert 99.5 GBP to JPY.",
    "Tell me the temperature in Paris in fahrenheit.",
    "I need 1200 CHF in USD.",
    "Weather for Nairobi, please.",
    "What do 10 Canadian dollars buy in Mexican pesos?",
    "Should I take an umbrella in Seattle today?",
    "Turn 5000 INR into EUR.",
]

failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what, file=sys.stderr)


def chat(client, stream, **kw):
    """(content, tool_calls as [(name, arguments dict or text)], finish_reason)."""
    if not stream:
        r = client.chat.completions.create(model="m", stream=False, **kw)
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]
        return m.content or "", calls, r.choices[0].finish_reason
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model="m", stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
        finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("--json-prompts", type=int, default=10)
    ap.add_argument("--tool-prompts", type=int, default=10)
    ap.add_argument("--lenient", action="store_true", help="also the model-dependent auto check")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key="none", max_retries=0, timeout=300)
    counts = {"json_answers": 0, "json_valid": 0, "required_calls": 0, "required_valid": 0}

    for schema_name, schema in SCHEMAS.items():
        validator = jsonschema.Draft202012Validator(schema)
        for i, subject in enumerate(SUBJECTS[: a.json_prompts]):
            for stream in (False, True):
                counts["json_answers"] += 1
                content, calls, finish = chat(
                    client,
                    stream,
                    messages=[
                        {"role": "system", "content": "You answer with JSON only."},
                        {"role": "user", "content": f"Write a '{schema_name}' record about {subject}."},
                    ],
                    temperature=0,
                    max_tokens=400,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": schema_name, "schema": schema, "strict": True},
                    },
                )
                where = f"{schema_name} prompt {i} stream={stream}"
                try:
                    value = json.loads(content)
                except json.JSONDecodeError as e:
                    fail(f"{where}: not JSON ({e}, finish {finish}): {content!r}")
                    continue
                errors = [e.message for e in validator.iter_errors(value)]
                if errors or finish != "stop" or calls:
                    fail(f"{where}: {errors} finish {finish} calls {calls}: {content}")
                else:
                    counts["json_valid"] += 1

    tool_validators = {
        t["function"]["name"]: jsonschema.Draft202012Validator(t["function"]["parameters"]) for t in TOOLS
    }
    for i, prompt in enumerate(TOOL_PROMPTS[: a.tool_prompts]):
        stream = i % 2 == 1
        counts["required_calls"] += 1
        content, calls, finish = chat(
            client,
            stream,
            messages=[{"role": "user", "content": prompt}],
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            max_tokens=200,
        )
        where = f"required prompt {i} stream={stream}"
        if not calls or finish != "tool_calls":
            fail(f"{where}: no call (finish {finish}): {content!r}")
            continue
        ok = True
        for name, args in calls:
            if name not in tool_validators:
                fail(f"{where}: undeclared tool {name}")
                ok = False
                continue
            errors = [e.message for e in tool_validators[name].iter_errors(json.loads(args))]
            if errors:
                fail(f"{where}: {name} {args}: {errors}")
                ok = False
        counts["required_valid"] += ok

    # Under "auto": an answer that is a fenced or bare JSON call of a declared tool is a call,
    # streamed and not; one naming an undeclared tool stays content. The grammar makes the
    # model write exactly those shapes, so this does not depend on the model's habits.
    shapes = {
        "fenced": '"```json\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" /[A-Z][a-z]{2,8}/ "\\", \\"unit\\": \\"celsius\\"}}\\n```"',
        "bare": '"{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" /[A-Z][a-z]{2,8}/ "\\", \\"unit\\": \\"celsius\\"}}"',
        "undeclared": '"```json\\n{\\"name\\": \\"send_email\\", \\"arguments\\": {\\"to\\": \\"" /[a-z]{2,8}/ "\\"}}\\n```"',
    }
    for shape, body in shapes.items():
        for stream in (False, True):
            content, calls, finish = chat(
                client,
                stream,
                messages=[{"role": "user", "content": "Use get_weather for Tokyo."}],
                tools=TOOLS,
                temperature=0,
                max_tokens=100,
                extra_body={"grammar": f"start: {body}\n"},
            )
            where = f"auto {shape} stream={stream}"
            if shape == "undeclared":
                if calls or not content.startswith("```json") or finish != "stop":
                    fail(f"{where}: should stay content: {content!r} {calls} {finish}")
            elif len(calls) != 1 or calls[0][0] != "get_weather" or content or finish != "tool_calls":
                fail(f"{where}: {content!r} {calls} {finish}")
            else:
                jsonschema.validate(json.loads(calls[0][1]), TOOLS[0]["function"]["parameters"])

    if a.lenient:
        # The report, as a new user tries it: no grammar, the model's own habit.
        for stream in (False, True):
            content, calls, finish = chat(
                client,
                stream,
                messages=[{"role": "user", "content": "Use get_weather for Tokyo."}],
                tools=TOOLS[:1],
                temperature=0,
                max_tokens=100,
            )
            if not calls or calls[0][0] != "get_weather":
                fail(f"auto, the model's own answer, stream={stream}: {content!r} {finish}")
            counts[f"auto_call_stream_{stream}"] = bool(calls)

    counts["failures"] = len(failures)
    print(json.dumps(counts))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
