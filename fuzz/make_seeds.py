#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/), small inputs in each target's
input layout (see fuzz/targets.rs). Run from anywhere; it rewrites only the files it names.

    python3 fuzz/make_seeds.py

The GGUF seeds are cut from the repository's random-weight fixtures (their metadata alone,
their header with the tensor data cut off, a prefix) plus one small file written here with a
tensor of every ggml type and a value of every metadata type.
"""

import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "golden", "fixtures")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- GGUF ----------------------------------------------------------------------------------

def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def header_end(buf):
    """(offset where the metadata ends, offset where the tensor table ends, n_tensors)."""
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
    pos += 16

    def skip_value(t, pos):
        if t == 8:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return pos + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            for _ in range(n):
                pos = skip_value(et, pos)
            return pos
        return pos + struct.calcsize(SCALARS[t])

    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        (t,) = struct.unpack_from("<I", buf, pos)
        pos = skip_value(t, pos + 4)
    meta_end = pos
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        (nd,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * nd + 4 + 8
    return meta_end, pos, n_tensors


def metadata_only(buf):
    """The file's metadata with no tensors: a valid GGUF."""
    meta_end, _, _ = header_end(buf)
    return buf[:8] + struct.pack("<Q", 0) + buf[16:meta_end]


def kv(key, type_id, payload):
    return gguf_str(key) + struct.pack("<I", type_id) + payload


# (name, type id, block size, block bytes), as src/quant/mod.rs.
TYPES = [
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22),
    ("Q5_1", 7, 32, 24), ("Q8_0", 8, 32, 34), ("Q8_1", 9, 32, 36), ("Q2_K", 10, 256, 84),
    ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144), ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210),
    ("Q8_K", 15, 256, 292), ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74), ("IQ3_XXS", 18, 256, 98),
    ("IQ1_S", 19, 256, 50), ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110), ("IQ2_S", 22, 256, 82),
    ("IQ4_XS", 23, 256, 136), ("I8", 24, 1, 1), ("I16", 25, 1, 2), ("I32", 26, 1, 4), ("I64", 27, 1, 8),
    ("F64", 28, 1, 8), ("IQ1_M", 29, 256, 56), ("BF16", 30, 1, 2), ("TQ1_0", 34, 256, 54),
    ("TQ2_0", 35, 256, 66), ("MXFP4", 39, 32, 17), ("NVFP4", 40, 64, 36),
]


def every_type_file(version=3, alignment=32):
    """A small file: a value of every metadata type, one row of a tensor of every ggml type."""
    metas = [
        kv("general.architecture", 8, gguf_str("llama")),
        kv("general.alignment", 4, struct.pack("<I", alignment)),
        kv("u8", 0, struct.pack("<B", 7)), kv("i8", 1, struct.pack("<b", -7)),
        kv("u16", 2, struct.pack("<H", 700)), kv("i16", 3, struct.pack("<h", -700)),
        kv("llama.block_count", 4, struct.pack("<I", 1)), kv("i32", 5, struct.pack("<i", -70000)),
        kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)), kv("bool", 7, b"\x01"),
        kv("u64", 10, struct.pack("<Q", 1 << 40)), kv("i64", 11, struct.pack("<q", -(1 << 40))),
        kv("f64", 12, struct.pack("<d", 0.5)),
        kv("strings", 9, struct.pack("<IQ", 8, 2) + gguf_str("a") + gguf_str("日本")),
        kv("nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 1) + struct.pack("<I", 1)
           + struct.pack("<IQ", 6, 2) + struct.pack("<ff", 1.0, -2.0)),
        kv("empty", 9, struct.pack("<IQ", 0, 0)),
    ]
    infos = b""
    data = b""
    for i, (name, tid, block, nbytes) in enumerate(TYPES):
        elems = block if block > 1 else 8
        size = (elems // block) * nbytes
        off = len(data)
        infos += gguf_str(f"t.{name}") + struct.pack("<I", 1) + struct.pack("<Q", elems) + struct.pack("<I", tid) + struct.pack("<Q", off)
        # Deterministic bytes; scales kept small so the floats stay finite where they can.
        blob = bytes(((i * 31 + j * 7) % 251) & 0x3F for j in range(size))
        data += blob + b"\0" * ((-len(blob)) % alignment)
    # A 2-D tensor too.
    infos += gguf_str("t.matrix") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 2) + struct.pack("<I", 0) + struct.pack("<Q", len(data))
    data += struct.pack("<8f", *[float(x) for x in range(8)])
    head = b"GGUF" + struct.pack("<IQQ", version, len(TYPES) + 1, len(metas)) + b"".join(metas) + infos
    head += b"\0" * ((-len(head)) % alignment)
    return head + data


def gguf_seeds():
    qwen2 = open(os.path.join(FIXTURES, "qwen2.Q4_K_M.gguf"), "rb").read()
    gptoss = open(os.path.join(FIXTURES, "gpt-oss.Q4_K_M.gguf"), "rb").read()
    _, table_end, _ = header_end(qwen2)
    files = {
        "qwen2-metadata.gguf": metadata_only(qwen2),
        "gpt-oss-metadata.gguf": metadata_only(gptoss),
        # The tensor table with the data cut off: every tensor lies past the end.
        "qwen2-header-no-data.gguf": qwen2[:table_end],
        "qwen2-prefix-300.gguf": qwen2[:300],
        "every-type-v3.gguf": every_type_file(),
        "every-type-v2-align64.gguf": every_type_file(version=2, alignment=64),
        "empty-v3.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 0),
        "split-part.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 3)
        + kv("split.no", 2, struct.pack("<H", 0)) + kv("split.count", 2, struct.pack("<H", 2))
        + kv("split.tensors.count", 5, struct.pack("<i", 0)),
        "bad-magic": b"GGML" + struct.pack("<IQQ", 3, 0, 0),
        "big-endian.gguf": b"GGUF" + struct.pack(">IQQ", 3, 0, 0),
    }
    for name, data in files.items():
        write("gguf", name, data)
    # gguf_stream: seed, mode (chunk range | lie), 8 bytes of extra length, the file.
    stream = [
        ("qwen2-metadata-7b", 1, 3, 0, "qwen2-metadata.gguf"),
        ("qwen2-metadata-whole", 2, 7, 0, "qwen2-metadata.gguf"),
        ("every-type-1b", 3, 0, 0, "every-type-v3.gguf"),
        ("every-type-16b", 4, 4, 0, "every-type-v3.gguf"),
        ("every-type-v2-100b", 5, 5, 0, "every-type-v2-align64.gguf"),
        ("every-type-lying-length", 6, 0x08 | 6, 1 << 20, "every-type-v3.gguf"),
        ("header-no-data-4k", 7, 6, 0, "qwen2-header-no-data.gguf"),
        ("prefix-lying-length", 8, 0x08 | 7, 1 << 33, "qwen2-prefix-300.gguf"),
        ("empty", 9, 7, 0, "empty-v3.gguf"),
    ]
    for name, seed, mode, extra, src in stream:
        write("gguf_stream", name, bytes([seed, mode]) + struct.pack("<Q", extra) + files[src])


# --- Text targets ----------------------------------------------------------------------------

TEXTS = [
    "Hello world",
    "Hello, world! How are you today? I'm fine; we'll see. DON'T SHOUT.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_end|><|im_start|>",
    "<s>[INST] hi [/INST]</s><start_of_turn>user\nhi<end_of_turn><mask><unused0>",
    "def f(x):\n    return x * 2  # comment\n\n\tprint(f(21))\r\n",
    "numbers: 1 12 123 1234 12345 3.14159 -42 1e10 0x1F",
    "   leading and trailing spaces   \n\n\n",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Ünïcödé façade naïve café ß Ω ≈ ∑ → 🙂👍🏽👨‍👩‍👧",
    "مرحبا بالعالم שלום עולם",
    "a" * 300,
    " " * 40 + "\t" * 10 + "\n" * 10,
    "<think>\nreasoning\n</think>\n\n{\"name\": \"search\", \"arguments\": {}}",
]


def tokenizer_seeds():
    sels = [0x00, 0x31, 0x12, 0x23, 0x04, 0x35, 0x06, 0x27, 0x08, 0x29, 0x0A, 0x3B, 0x0C, 0x2B]
    for i, text in enumerate(TEXTS):
        write("tokenizer", f"text-{i:02}", bytes([sels[i % len(sels)]]) + text.encode())
    write("tokenizer", "invalid-utf8", bytes([0x21]) + b"ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 end")
    write("tokenizer", "ids-high", bytes([0x0B]) + bytes(range(256)))


def conversation():
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "Bye"}]},
    ]


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
     "properties": {"query": {"type": "string"}, "n": {"type": "integer", "minimum": 1}}}}},
]

HOSTILE_TEMPLATES = [
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{% for i in range(1000000) %}x{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ raise_exception('bad role') }}",
    "{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%Q %') }}",
    "{{ messages | tojson(indent=2, sort_keys=true, ensure_ascii=true) }}{{ tools | tojson }}",
    "{{ 'ab' * 1000 }}{{ [1, 2] * 3 }}",
    "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'].strip().split(' ') | join('-') }}{% endif %}"
    "{{ messages[1].content.startswith('W') }}{{ 'x'.upper() }}{{ bos_token }}{{ eos_token }}",
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{{ c.function.arguments.city }}{% endfor %}{% endif %}{% endfor %}",
    "{{ enable_thinking }}{{ foo.bar.baz }}{{ undefined_var | default('d') }}",
    "{% for %}",
    "{{ 1 / 0 }}",
    "{% set x = messages | map(attribute='role') | list %}{{ x | unique | list | reverse | join(',') }}{{ x | length }}",
    "{{ range(5, 0, -1) | list }}{{ range(0) }}{{ range(1, 2, 0) }}",
    "{% set c %}{% for i in range(100) %}{{ loop.index }}{% endfor %}{% endset %}{{ c | wordcount }}{{ c[2:10] }}",
    "{% for k, v in tools[0].function.parameters.properties | dictsort %}{{ k }}={{ v.type }};{% endfor %}",
    "{{ (messages | last).content | trim | truncate(3) }}{{ '%s-%d' % ('a', 1) }}{{ 'a{}'.format(1) }}",
]


def chat_template_seeds():
    conv = json.dumps({"messages": conversation(), "tools": TOOLS,
                       "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"}})
    # Hostile templates (flags bits 2.. = 0), with the conversation or plain turns.
    for i, t in enumerate(HOSTILE_TEMPLATES):
        msgs = conv if i % 2 == 0 else "be brief\x01hi\x01hello\x01{\"temp\": 1}\x01more"
        write("chat_template", f"hostile-{i:02}", bytes([0x03 if i % 3 else 0x01]) + t.encode() + b"\0" + msgs.encode())
    # Each fixed template (1 ..= 11) with the conversation, with turns, and with odd messages.
    odd = json.dumps([{"role": "user"}, {"content": 5}, "text", None, {"role": "assistant", "tool_calls": "x"},
                      {"role": "assistant", "tool_calls": [{"function": {"arguments": "not json"}}]}])
    for k in range(1, 12):
        write("chat_template", f"fixed-{k:02}-conversation", bytes([(k << 2) | 3]) + b"\0" + conv.encode())
        write("chat_template", f"fixed-{k:02}-turns", bytes([(k << 2) | 1]) + b"\0" + "sys\x01hi <|im_end|>\x01a\x01t".encode())
        write("chat_template", f"fixed-{k:02}-odd", bytes([(k << 2)]) + b"\0" + odd.encode())


def openai_seeds():
    bodies = {
        "chat-basic": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                       "temperature": 0.7, "top_p": 0.9, "seed": 1, "stream": True,
                       "stream_options": {"include_usage": True}},
        "chat-tools": {"messages": conversation(), "tools": TOOLS, "tool_choice": "required",
                       "parallel_tool_calls": False, "chat_template_kwargs": {"enable_thinking": False},
                       "reasoning_effort": "high"},
        "chat-named-tool": {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                            "tool_choice": {"type": "function", "function": {"name": "search"}}},
        "chat-json-schema": {"messages": [{"role": "user", "content": "x"}],
                             "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": False,
                                                 "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}},
        "chat-json-object": {"messages": [{"role": "user", "content": "x"}],
                             "response_format": {"type": "json_object", "schema": True}},
        "chat-grammar": {"messages": [{"role": "user", "content": "x"}], "grammar": "start: \"yes\" | \"no\"",
                         "logprobs": True, "top_logprobs": 5, "stop": ["\n", "END"]},
        "chat-bad-types": {"messages": [{"role": 5, "content": [{"type": "image_url"}]}], "n": 2, "echo": True,
                           "logprobs": 3, "top_logprobs": 99, "temperature": -1, "stop": ["a"] * 20},
        "completion-text": {"prompt": "Once upon", "max_tokens": 0, "n_predict": -1, "min_p": 0.1,
                            "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5, "top_k": 40},
        "completion-ids": {"prompt": [1, 2, 3, 4294967295], "logprobs": 2, "max_completion_tokens": 5},
        "completion-texts": {"prompt": ["a", "b"], "stop": "x"},
        "tokenize": {"content": "hello <|im_start|>", "add_special": True, "with_pieces": True},
        "detokenize": {"tokens": [1, 2, 3]},
        "apply-template": {"messages": conversation(), "tools": TOOLS, "add_generation_prompt": True},
    }
    for name, body in bodies.items():
        write("openai_request", name, json.dumps(body))
    write("openai_request", "invalid-json", b'{"messages": [')
    write("openai_request", "not-object", b"[1, 2, 3]")


ROUTER = [
    # (format index, text)
    (0, "<think>plan it</think>\n\nSure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
    (0, "{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}"),
    (0, "```json\n{\"name\": \"search\", \"arguments\": {}}\n```"),
    (0, "<tool_call>{\"name\": \"nope\", broken</tool_call> after"),
    (1, "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}"),
    (1, "[{\"name\": \"search\", \"parameters\": {}}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"R\"}}]"),
    (2, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"),
    (3, "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi!"),
    (3, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"x\"}"),
    (3, " to=functions.search <|channel|>commentary json<|message|>{\"query\": 1}<|call|>"),
    (4, "<think>r</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        "{\"city\": \"Rome\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (5, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜>"
        "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (6, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    (7, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call>"),
    (7, "<function=search>\n<parameter=query>\nq\n</parameter>\n</function>"),
]


def router_seeds():
    for i, (fmt, text) in enumerate(ROUTER):
        b = text.encode()
        # Chunk boundaries (0xFF) at a few places, some inside multi-byte characters' markers.
        cut = bytearray()
        for j, ch in enumerate(text):
            if j % 5 == 3:
                cut.append(0xFF)
            cut += ch.encode()
        flags = fmt | 0x08 | (0x10 if i % 4 == 1 else 0) | (0x20 if fmt == 7 else 0)
        write("output_router", f"{i:02}-fmt{fmt}", bytes([flags]) + bytes(cut))
        write("output_router", f"{i:02}-fmt{fmt}-whole-no-tools", bytes([fmt]) + b)


def grammar_seeds():
    def put(name, flags, body):
        write("grammar", name, bytes([flags, 7, 0]) + (body.encode() if isinstance(body, str) else body))

    larks = [
        "start: \"yes\" | \"no\"",
        "start: /[a-z]+/ \"!\"",
        "start: \"(\" start \")\" | \"\"",
        "start: item+\nitem: %json {\"type\": \"integer\"} \",\"",
        "start: <[383]> \"x\" <|im_end|>",
        "%llguidance {}\nstart: text\ntext[stop=\"</s>\"]: /(.|\\n)*/",
        "start: a b\na: \"a\"{2,5}\nb: /[0-9]{1,3}/",
        "start: ",
    ]
    for i, g in enumerate(larks):
        put(f"lark-{i}", 0 | (4 if i % 2 else 0), g)
    schemas = [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "b": {"type": "string", "enum": ["x", "y"]}}, "required": ["a"],
         "additionalProperties": False},
        {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        {"anyOf": [{"type": "string", "pattern": "^[a-z]{2}$"}, {"type": "null"}, {"type": "boolean"}]},
        {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
        {"type": "string", "format": "date-time"},
        {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}},
         "unknownKeyword": 1},
        True,
        {"oneOf": [{"const": 1}, {"const": "a"}], "allOf": [{}]},
    ]
    for i, s in enumerate(schemas):
        put(f"schema-{i}", 1 | (0x40 if i % 2 else 0) | (4 if i % 3 == 0 else 0), json.dumps(s))
    for fmt in range(8):
        put(f"tool-call-fmt{fmt}", 2 | (fmt << 3) | (0x80 if fmt % 2 else 0), json.dumps(TOOLS))
    put("tool-call-bare-schema", 2 | 0x80, json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}}))
    lazy = [
        (0x00, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P"),
        (0x80, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\"}}"),
        (0x00, "```json\n{ \"name\" : \"se"),
        (0x00, "Sure, here you go"),
    ]
    for i, (flags, answer) in enumerate(lazy):
        put(f"lazy-{i}", 3 | flags, json.dumps(TOOLS).encode() + b"\0" + answer.encode())


# --- Dictionaries (libFuzzer -dict): tokens the targets compare against ---------------------

DICTS = {
    "output_router": [
        "<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "```", "```json",
        "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>",
        "analysis", "final", "commentary", " to=functions.", "functions.", "assistant", "json",
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>", "<｜tool_calls_begin｜>", "<｜tool calls begin｜>", "<｜tool▁calls｜>", "function",
        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<function=", "</function>", "<parameter=",
        "</parameter>", "get_weather", "search", "city", "query", '"name"', '"arguments"', '"parameters"',
        "{", "}", "[", "]", ":", ",", "\n", b"\xff",
    ],
    "chat_template": [
        "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "for ", " in ", "endfor", "if ", "elif ", "else",
        "endif", "set ", "endset", "macro ", "endmacro", "call", "namespace(", "loop.index", "loop.last",
        "messages", "message", "role", "content", "tools", "tool_calls", "function", "arguments",
        "add_generation_prompt", "bos_token", "eos_token", "raise_exception(", "strftime_now(", "range(",
        "|tojson", "|length", "|join", "|trim", "|safe", "|items", "|list", "|map", "|selectattr",
        "indent=", "sort_keys=True", "ensure_ascii=", ".split(", ".strip(", ".startswith(", ".endswith(",
        ".replace(", ".upper()", ".format(", " ~ ", " * ", "is defined", "is none", "is iterable",
        "is string", "is mapping", "reasoning_content", "thinking", "enable_thinking", "<|channel|>",
        '"role"', '"content"', '"messages"', '"tools"', '"tool_calls"', b"\x00", b"\x01",
    ],
    "grammar": [
        "start:", "%json", "%llguidance", "%ignore", "%import", "|", "*", "+", "?", "{1,3}", "(", ")",
        "/[a-z]+/", '"x"', "<[383]>", "<|im_end|>", "[stop=", "[capture", "[lazy]", "max_tokens=",
        '"type"', '"object"', '"array"', '"string"', '"integer"', '"number"', '"boolean"', '"null"',
        '"properties"', '"required"', '"items"', '"prefixItems"', '"enum"', '"const"', '"anyOf"', '"oneOf"',
        '"allOf"', '"$ref"', '"$defs"', '"#/$defs/"', '"pattern"', '"format"', '"minLength"', '"maxLength"',
        '"minimum"', '"maximum"', '"minItems"', '"maxItems"', '"additionalProperties"', '"x-guidance"',
        '"function"', '"name"', '"parameters"', '"date-time"', '"email"', '"uuid"', '{"name": "',
        "<tool_call>", "```json",
    ],
    "openai_request": [
        '"messages"', '"role"', '"content"', '"user"', '"assistant"', '"system"', '"tool"', '"tools"',
        '"tool_choice"', '"auto"', '"none"', '"required"', '"function"', '"name"', '"type"', '"text"',
        '"prompt"', '"max_tokens"', '"max_completion_tokens"', '"n_predict"', '"temperature"', '"top_p"',
        '"top_k"', '"min_p"', '"seed"', '"stop"', '"logprobs"', '"top_logprobs"', '"stream"',
        '"stream_options"', '"response_format"', '"json_schema"', '"json_object"', '"schema"', '"strict"',
        '"grammar"', '"n"', '"echo"', '"reasoning_effort"', '"chat_template_kwargs"', '"parallel_tool_calls"',
        '"tool_calls"', '"arguments"', '"tokens"', '"add_special"', "true", "false", "null", "-1",
        "4294967295", "1e309",
    ],
    "tokenizer": [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<start_of_turn>",
        "<end_of_turn>", "<mask>", "<unused0>", "<eot>", "'s", "'ll", "'RE", " the", "hello", "world",
        "123", "\n\n", "\t", "  ",
    ],
}


def dict_entry(token):
    """One libFuzzer dictionary line: printable ASCII as is, other bytes, quote and backslash
    as \\xNN."""
    raw = token if isinstance(token, bytes) else token.encode("utf-8")
    body = "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in raw)
    return f'"{body}"'


def dicts():
    d = os.path.join(ROOT, "fuzz", "dicts")
    os.makedirs(d, exist_ok=True)
    for target, tokens in DICTS.items():
        with open(os.path.join(d, f"{target}.dict"), "w") as f:
            f.write("".join(dict_entry(t) + "\n" for t in tokens))


if __name__ == "__main__":
    dicts()
    gguf_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    openai_seeds()
    router_seeds()
    grammar_seeds()
