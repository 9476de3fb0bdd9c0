//! Constrained decoding end to end on the CPU: a random-weight fixture model, which left alone
//! writes noise, held to JSON schemas, JSON, Lark grammars and forced tool calls. Every answer
//! is checked by an independent validator (the `jsonschema` crate), over several seeds at
//! temperature 1, so the grammar (not luck) is what makes them valid.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::golden;
use serde_json::{json, Value};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::chat::router::Routed;
use tinyllm::chat::tools::ToolChoice;
use tinyllm::engine::{generate, Engine, EngineError, Finish, Flow, Prompt, Request, Settings};
use tinyllm::gguf::GgufFile;
use tinyllm::grammar::AnswerFormat;
use tinyllm::sample::SamplerConfig;

fn engine() -> Engine<CpuBackend> {
    let file = GgufFile::open(golden("fixtures/qwen2.Q8_0.gguf")).expect("fixture");
    Engine::load(CpuBackend::new(1).expect("cpu"), Arc::new(file)).expect("load")
}

/// Content, tool calls (name, arguments) and how the answer ended.
fn answer(engine: &Engine<CpuBackend>, req: Request) -> (String, Vec<(String, Value)>, Finish) {
    let prepared = engine.prepare_request(&req).expect("prepare");
    let mut gen = engine.generation(prepared, req.settings).expect("generation");
    let mut session = engine.session(2048).expect("session");
    let (mut text, mut calls) = (String::new(), Vec::new());
    let finish = generate(&mut session, &mut gen, &AtomicBool::new(false), |step| {
        for o in &step.outputs {
            match o {
                Routed::Content(c) => text.push_str(c),
                Routed::ToolCall(c) => calls.push((c.name.clone(), serde_json::from_str(&c.arguments).unwrap())),
                Routed::Reasoning(_) => {}
            }
        }
        Flow::Continue
    })
    .expect("generate");
    (text, calls, finish)
}

fn settings(seed: u64, max_tokens: usize) -> Settings {
    Settings {
        sampler: SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerConfig::default()
        },
        max_tokens: Some(max_tokens),
        ..Settings::default()
    }
}

fn text_request(format: AnswerFormat, seed: u64) -> Request {
    Request {
        prompt: Prompt::Text {
            text: "Answer in JSON:".into(),
            add_special: true,
            parse_special: false,
        },
        settings: settings(seed, 1500),
        format,
    }
}

/// The issue's shapes: nested objects, enums, integer bounds, arrays with `minItems`,
/// required fields. Strings and arrays are bounded so a random model's answer ends.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "address": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
                "required": ["city", "zip"], "additionalProperties": false}},
            "required": ["name", "age", "address"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "sizes": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                      "minItems": 2, "maxItems": 4}},
            "required": ["color", "sizes"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                    "ok": {"type": "boolean"}},
                "required": ["sku", "ok"], "additionalProperties": false}}},
            "required": ["items"], "additionalProperties": false}),
    ]
}

#[test]
fn json_schema_answers_validate_on_every_seed() {
    let e = engine();
    for schema in schemas() {
        let validator = jsonschema::validator_for(&schema).expect("valid schema");
        for seed in 0..4 {
            let format = AnswerFormat::JsonSchema {
                schema: schema.clone(),
                strict: true,
            };
            let (text, calls, finish) = answer(&e, text_request(format, seed));
            assert!(calls.is_empty());
            assert_eq!(finish, Finish::EndOfGeneration, "seed {seed}: {text:?}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("seed {seed}: {err}: {text:?}"));
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "seed {seed}: {text} {errors:?}");
        }
    }
}

#[test]
fn the_same_model_unconstrained_writes_no_json() {
    // The control for the test above: without the grammar the fixture's answer is noise.
    let e = engine();
    let mut parsed = 0;
    for seed in 0..4 {
        let (text, _, _) = answer(&e, text_request(AnswerFormat::Free, seed));
        parsed += serde_json::from_str::<Value>(&text).is_ok() as usize;
    }
    assert_eq!(parsed, 0);
}

#[test]
fn json_object_and_lark_grammars_hold() {
    let e = engine();
    let re = regex::Regex::new(r"^(yes|no) because [a-z]{1,8}\.$").unwrap();
    let mut ended = 0;
    for seed in 0..3 {
        // Any object: its strings are unbounded, so a random model may spend its budget in
        // one; what it wrote is then an object cut short.
        let (text, _, finish) = answer(&e, text_request(AnswerFormat::JsonObject, seed));
        if finish == Finish::EndOfGeneration {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text:?}"));
            assert!(v.is_object(), "{text}");
            ended += 1;
        } else {
            assert!(text.starts_with('{'), "{text:?}");
        }
        let lark = r#"start: ("yes" | "no") " because " /[a-z]{1,8}/ "."
"#;
        let (text, _, finish) = answer(&e, text_request(AnswerFormat::Lark(lark.into()), seed));
        assert_eq!(finish, Finish::EndOfGeneration, "{text:?}");
        assert!(re.is_match(&text), "{text:?}");
    }
    assert!(ended > 0, "no JSON object answer ended within its budget");
}

#[test]
fn bad_schemas_and_grammars_are_named_errors() {
    let e = engine();
    let cases = [
        (AnswerFormat::Lark("start: (".into()), "grammar"),
        (AnswerFormat::Lark("start: missing_rule\n".into()), "grammar"),
        (
            AnswerFormat::JsonSchema {
                schema: json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
                strict: true,
            },
            "response_format",
        ),
    ];
    for (format, param) in cases {
        match e.prepare_request(&text_request(format.clone(), 0)) {
            Err(EngineError::Invalid { param: p, problem }) => {
                assert_eq!(p, param, "{problem}");
                assert!(problem.starts_with(param), "{problem}");
            }
            other => panic!("{format:?}: {other:?}"),
        }
    }
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}}),
        json!({"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a", "b"],
            "additionalProperties": false}}}),
    ]
}

fn chat_request(choice: ToolChoice, seed: u64) -> Request {
    Request {
        prompt: Prompt::Chat {
            messages: vec![json!({"role": "user", "content": "Weather in Oslo?"})],
            tools: tools(),
            tool_choice: choice,
            kwargs: Default::default(),
        },
        settings: Settings {
            parallel_tool_calls: false,
            ..settings(seed, 300)
        },
        format: AnswerFormat::Free,
    }
}

#[test]
fn forced_tool_calls_validate_against_their_tool() {
    let e = engine();
    let validators: Vec<(String, jsonschema::Validator)> = tools()
        .iter()
        .map(|t| {
            let name = t["function"]["name"].as_str().unwrap().to_string();
            (name, jsonschema::validator_for(&t["function"]["parameters"]).unwrap())
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..6 {
        for choice in [ToolChoice::Required, ToolChoice::Named("add".into())] {
            let (text, calls, _) = answer(&e, chat_request(choice.clone(), seed));
            assert!(!calls.is_empty(), "{choice:?} seed {seed}: no call, content {text:?}");
            let (name, args) = &calls[0];
            if let ToolChoice::Named(n) = &choice {
                assert_eq!(name, n);
            }
            let (_, v) = validators.iter().find(|(n, _)| n == name).expect("a declared tool");
            let errors: Vec<String> = v.iter_errors(args).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{name} {args} {errors:?}");
            seen.insert(name.clone());
        }
    }
    // `required` leaves the choice of tool to the model: over the seeds both are taken.
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn a_format_and_a_forced_call_together_are_refused() {
    let e = engine();
    let mut req = chat_request(ToolChoice::Required, 0);
    req.format = AnswerFormat::JsonObject;
    match e.prepare_request(&req) {
        Err(EngineError::Invalid { param, .. }) => assert_eq!(param, "response_format"),
        other => panic!("{other:?}"),
    }
}

/// Where the grammar fixes the text, every spelling of it is allowed, not only the
/// tokenizer's own: the scripted harmony model writes a forced call's arguments as one token
/// (`{"city": "Lyon"}`), which a canonical-only mask (byte pieces here) would forbid, sending
/// the model off its script.
#[test]
fn forced_text_allows_the_models_own_spelling() {
    let path = common::scripted::write_model("grammar-harmony.gguf", &common::scripted::harmony_model());
    let e = Engine::load(CpuBackend::new(1).unwrap(), Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let tok = &e.tokenizer;
    let whole = (0..tok.vocab_size() as u32)
        .find(|&i| tok.token_to_piece(i).unwrap() == br#"{"city": "Lyon"}"#)
        .expect("the scripted token");
    let canonical = tok.encode(r#"{"city": "Lyon"}"#, false, false);
    assert!(canonical.len() > 1 && !canonical.contains(&whole));
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
    ];
    let literal = "start: \"{\\\"city\\\": \\\"Lyon\\\"}\"\n".to_string();
    let forced = tinyllm::grammar::tool_call_grammar(
        tok,
        tinyllm::chat::router::ToolFormat::Harmony,
        &ToolChoice::Named("get_weather".into()),
        &tools,
    )
    .unwrap();
    for g in [forced, literal] {
        let mut c = e.grammars.compile(&g, "grammar").unwrap();
        let mut logits = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        assert!(
            allowed.contains(&whole) && allowed.contains(&canonical[0]),
            "{g}: {allowed:?}"
        );
    }
}

#[test]
fn a_call_begun_under_auto_is_held_to_its_tools_schema() {
    use tinyllm::grammar::{Grammars, LazyCalls, Watch};
    use tinyllm::tokenizer::Tokenizer;
    let file = GgufFile::open(golden("fixtures/qwen2.Q8_0.gguf")).expect("fixture");
    let tok = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let grammars = Arc::new(Grammars::new(Arc::clone(&tok)));
    let validator = |name: &str| {
        let t = tools()
            .into_iter()
            .find(|t| t["function"]["name"] == name)
            .expect("declared");
        jsonschema::validator_for(&t["function"]["parameters"]).unwrap()
    };

    // (how the answer begins, fed a character at a time; the piece that writes the name's
    // opening quote, with text past it as one token may carry; what must close the call;
    // Hermes tags). The name itself is the grammar's to hold to a declared one.
    let openings = [
        ("{\"name\": ", "\"ad", "", false),
        ("\n```json\n{\n  \"name\": ", "\"get_weather\",\n  ", "```", false),
        ("<tool_call>\n{\"name\":", "\"", "</tool_call>", true),
        ("{\"name\" :", " \"", "", false),
    ];
    for (prefix, last, close, tagged) in openings {
        let opening = format!("{prefix}{last}");
        for seed in 1..=4u64 {
            let mut lazy = LazyCalls::new(Arc::clone(&grammars), &tools(), tagged).expect("tools");
            for (i, ch) in prefix.chars().enumerate() {
                assert!(
                    matches!(lazy.push(&ch.to_string()), Watch::Pending),
                    "{prefix:?} at {i}"
                );
            }
            let constraint = match lazy.push(last) {
                Watch::Call(constraint) => Some(*constraint),
                _ => None,
            };
            let mut c = constraint.unwrap_or_else(|| panic!("{opening:?}: never triggered"));
            // The rest, picked at random among what the grammar allows.
            // The "model": uniform random logits, so it picks at random among what the mask allows.
            let mut rng = common::rng::Rng(seed * 0x9E37_79B9_7F4A_7C15);
            let mut ids = Vec::new();
            for _ in 0..2000 {
                let mut logits = rng.vec(tok.vocab_size(), 1.0);
                c.mask(&mut logits).expect("mask");
                let t = (0..logits.len())
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                    .unwrap() as u32;
                let end = tok.is_eog(t);
                c.commit(t, end).expect("commit");
                if end {
                    break;
                }
                ids.push(t);
                // The call is complete: the constraint lets go (the answer is free again).
                if c.is_accepting() {
                    break;
                }
            }
            let text = format!("{opening}{}", tok.decode(&ids).unwrap());
            let body = text
                .trim_start()
                .trim_start_matches("```json")
                .trim_start_matches("<tool_call>");
            // The call object, then the closing (the token that ends the call may carry a
            // little free text after it).
            let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
            let v = values
                .next()
                .unwrap_or_else(|| panic!("{text:?}: no call"))
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let after = body[values.byte_offset()..].trim_start();
            assert!(after.starts_with(close), "{text:?} does not close with {close:?}");
            let name = v["name"].as_str().unwrap();
            let args = v.get("arguments").or_else(|| v.get("parameters")).expect("arguments");
            let errors: Vec<String> = validator(name).iter_errors(args).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{text:?}: {errors:?}");
        }
    }

    // Once the quote is written, only declared names may follow: the model's own spelling of
    // a name that is no tool (`Add`, `other`) is masked out, `add` is not.
    let mut lazy = LazyCalls::new(Arc::clone(&grammars), &tools(), false).expect("tools");
    let mut watch = Watch::Pending;
    for ch in "{\"name\": \"".chars() {
        watch = lazy.push(&ch.to_string());
    }
    let Watch::Call(mut c) = watch else {
        panic!("the quote did not begin a call")
    };
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).expect("mask");
    let allowed = |word: &str| {
        let ids = tok.encode(word, false, false);
        logits[ids[0] as usize] == 0.0
    };
    assert!(allowed("add") && allowed("get"), "declared names masked out");
    assert!(!allowed("Add") && !allowed("other"), "undeclared names allowed");
    // Text past the quote that is no declared name's beginning: the answer stays free.
    let mut lazy = LazyCalls::new(Arc::clone(&grammars), &tools(), false).expect("tools");
    for ch in "{\"name\": ".chars() {
        assert!(matches!(lazy.push(&ch.to_string()), Watch::Pending));
    }
    assert!(matches!(lazy.push("\"Add"), Watch::Free), "\"Add past the quote");

    // Answers that do not begin a call are left alone.
    for (text, tagged) in [
        ("Hello", true),
        ("{\"city\": \"Oslo\"}", false),
        ("{\"arguments\": {}, \"name\": \"add\"", false),
        ("```python\nprint(1)", false),
        ("<tool_call>{\"name\": \"add\"", false),
        ("[{\"name\": \"add\"", true),
    ] {
        let mut lazy = LazyCalls::new(Arc::clone(&grammars), &tools(), tagged).expect("tools");
        let mut freed = false;
        for ch in text.chars() {
            match lazy.push(&ch.to_string()) {
                Watch::Pending => {}
                Watch::Free => {
                    freed = true;
                    break;
                }
                Watch::Call(_) => panic!("{text:?} triggered a call"),
            }
        }
        assert!(freed, "{text:?} still watched");
    }
}
