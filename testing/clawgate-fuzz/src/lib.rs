//! Property-test inputs for clawgate's parsers of outside input (see the README).
//!
//! Every target takes its inputs from here, so "mutated JSON" means the same everywhere: a valid
//! payload of the parser's own kind, changed at one to four random places by a [`Mutation`], or
//! an arbitrary tree, or corrupted and arbitrary bytes. [`run`] runs a property over
//! [`cases()`] inputs (`CLAWGATE_FUZZ_CASES`) and panics with the minimal failing one.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // Test inputs: failures panic loudly.

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde_json::{Map, Number, Value};

pub mod meter;

pub use proptest;

/// The environment variable with the number of cases each target runs.
pub const CASES_VAR: &str = "CLAWGATE_FUZZ_CASES";

/// Cases per target in the normal test run: a few seconds at most per target.
pub const DEFAULT_CASES: u32 = 64;

/// `CLAWGATE_FUZZ_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var(CASES_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_CASES)
}

/// The runner configuration of every target: [`cases()`] cases, no regression files (a failure
/// prints its minimal input; it becomes a regular test beside the parser).
pub fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 2_048,
        ..Config::default()
    }
}

/// Runs `property` over [`cases()`] inputs of `strategy`; a failure (or a panic in `property`)
/// panics naming `target`, the reason and the minimal input.
pub fn run<S>(target: &str, strategy: S, property: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let mut runner = TestRunner::new(config());
    match runner.run(&strategy, property) {
        Ok(()) => {}
        Err(TestError::Fail(reason, input)) => {
            panic!("{target}: {reason}\nminimal failing input: {input:?}")
        }
        Err(TestError::Abort(reason)) => panic!("{target}: aborted: {reason}"),
    }
}

/// Strings parsers trip over: empty, NUL and control characters, terminal escapes, bidi
/// overrides, combining marks, the largest code point, numbers and keywords as text, path
/// traversal, very long ASCII and multi-byte text — and arbitrary Unicode.
pub fn odd_string() -> BoxedStrategy<String> {
    const SAMPLES: &[&str] = &[
        "",
        " ",
        "\0",
        "a\0b",
        "\u{1b}[2J\u{7}",
        "\r\n",
        "line\nbreak",
        "\u{202e}gnp.exe",
        "e\u{301}\u{301}\u{301}",
        "\u{feff}",
        "\u{fffd}",
        "\u{10ffff}",
        "👩‍👩‍👧‍👦",
        "-1",
        "0",
        "1e400",
        "18446744073709551616",
        "-9223372036854775809",
        "NaN",
        "null",
        "true",
        "[]",
        "{}",
        "../../etc/passwd",
        "%00",
        "%",
        "a,b,,c",
        "@bot",
        "#channel",
    ];
    prop_oneof![
        4 => proptest::sample::select(SAMPLES).prop_map(str::to_owned),
        3 => any::<String>(),
        1 => (1usize..=4).prop_map(|k| "x".repeat(k * 16_384)),
        1 => (1usize..=4).prop_map(|k| "é".repeat(k * 8_192)),
    ]
    .boxed()
}

/// Numbers at and past the edges of every integer type, fractions, huge floats.
pub fn odd_number() -> BoxedStrategy<Number> {
    prop_oneof![
        proptest::sample::select(vec![
            Number::from(0),
            Number::from(-1),
            Number::from(1),
            Number::from(255),
            Number::from(256),
            Number::from(65_536),
            Number::from(i32::MAX),
            Number::from(u32::MAX),
            Number::from(i64::MAX),
            Number::from(i64::MIN),
            Number::from(u64::MAX),
            Number::from(9_007_199_254_740_993_u64),
        ]),
        proptest::sample::select(vec![0.5, -0.0, 1e308, -1e308, f64::MIN_POSITIVE, 1.5e19])
            .prop_map(|f| Number::from_f64(f).unwrap()),
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
    ]
    .boxed()
}

/// An arbitrary JSON tree (a few levels, a few dozen nodes) of odd leaves.
pub fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        odd_number().prop_map(Value::Number),
        odd_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((odd_string(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A value of any kind a field should not hold: every JSON type, edge numbers, odd strings,
/// empty and deeply nested containers, a long array.
pub fn hostile_value() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        odd_number().prop_map(Value::Number),
        odd_string().prop_map(Value::String),
        Just(Value::Array(Vec::new())),
        Just(Value::Object(Map::new())),
        (1usize..=120, any::<bool>()).prop_map(|(depth, arrays)| nested(depth, arrays)),
        Just(Value::Array(vec![Value::Null; 4_096])),
        any_json(),
    ]
    .boxed()
}

/// `depth` arrays (or single-key objects) inside each other around `null`.
pub fn nested(depth: usize, arrays: bool) -> Value {
    let mut value = Value::Null;
    for _ in 0..depth {
        value = if arrays {
            Value::Array(vec![value])
        } else {
            let mut map = Map::new();
            map.insert("a".into(), value);
            Value::Object(map)
        };
    }
    value
}

/// One change to one node of a tree.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// The node becomes another value (usually of another type).
    Replace(Value),
    /// The node leaves its object (a missing field) or its array.
    Remove,
    /// The same content as another type: `"12"` ↔ `12`, `true` → `"true"`, a scalar in an array.
    Retype,
    /// Strings and arrays become very long, numbers their extremes.
    Stretch,
    /// An object gains a field (a new name or a near-duplicate of one it has).
    AddField(String, Value),
    /// The node is wrapped in an array or object.
    Wrap(bool),
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        4 => hostile_value().prop_map(Mutation::Replace),
        3 => Just(Mutation::Remove),
        2 => Just(Mutation::Retype),
        2 => Just(Mutation::Stretch),
        1 => (odd_string(), hostile_value()).prop_map(|(k, v)| Mutation::AddField(k, v)),
        1 => any::<bool>().prop_map(Mutation::Wrap),
    ]
    .boxed()
}

/// Every node of `value` as a path of steps, parents before children (the root is `[]`).
fn paths(value: &Value) -> Vec<Vec<Step>> {
    fn walk(value: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        out.push(path.clone());
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate().take(64) {
                    path.push(Step::Index(i));
                    walk(item, path, out);
                    path.pop();
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    path.push(Step::Key(key.clone()));
                    walk(item, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn node_mut<'a>(value: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |node, step| match step {
        Step::Key(key) => node.get_mut(key.as_str()),
        Step::Index(i) => node.get_mut(*i),
    })
}

/// Applies `mutation` to node `at` (modulo their number) of `value`, parents numbered before
/// children: `0` is the root, `1` its first child.
pub fn apply(value: &mut Value, at: usize, mutation: &Mutation) {
    let all = paths(value);
    let path = &all[at % all.len()];
    if let Mutation::Remove = mutation {
        let Some((last, parent)) = path.split_last() else {
            *value = Value::Null;
            return;
        };
        match (node_mut(value, parent), last) {
            (Some(Value::Object(map)), Step::Key(key)) => {
                map.remove(key);
            }
            (Some(Value::Array(items)), Step::Index(i)) if *i < items.len() => {
                items.remove(*i);
            }
            _ => {}
        }
        return;
    }
    let Some(node) = node_mut(value, path) else {
        return;
    };
    match mutation {
        Mutation::Replace(new) => *node = new.clone(),
        Mutation::Remove => {}
        Mutation::Retype => *node = retyped(node),
        Mutation::Stretch => stretch(node),
        Mutation::AddField(key, new) => match node {
            Value::Object(map) => {
                // Half the time a near-duplicate of a name the object has: `Id` beside `id`.
                let key = match map.keys().next() {
                    Some(first) if key.len() % 2 == 0 => first.to_uppercase(),
                    _ => key.clone(),
                };
                map.insert(key, new.clone());
            }
            Value::Array(items) => items.push(new.clone()),
            other => *other = new.clone(),
        },
        Mutation::Wrap(array) => {
            let inner = node.take();
            *node = if *array {
                Value::Array(vec![inner])
            } else {
                let mut map = Map::new();
                map.insert("value".into(), inner);
                Value::Object(map)
            };
        }
    }
}

fn retyped(node: &Value) -> Value {
    match node {
        Value::Null => Value::String("null".into()),
        Value::Bool(b) => Value::String(b.to_string()),
        Value::Number(n) => Value::String(n.to_string()),
        Value::String(s) => serde_json::from_str::<Number>(s.trim())
            .map(Value::Number)
            .unwrap_or_else(|_| Value::Array(vec![Value::String(s.clone())])),
        Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
        Value::Object(map) => Value::Array(map.values().cloned().collect()),
    }
}

fn stretch(node: &mut Value) {
    match node {
        Value::String(s) => {
            let unit = if s.is_empty() {
                "x".to_owned()
            } else {
                s.clone()
            };
            let times = 65_536 / unit.len() + 1;
            *s = unit.repeat(times);
        }
        Value::Number(n) => {
            *n = if n.is_f64() {
                Number::from_f64(f64::MAX).unwrap()
            } else if n.as_i64().is_some_and(|i| i < 0) {
                Number::from(i64::MIN)
            } else {
                Number::from(u64::MAX)
            };
        }
        Value::Array(items) => {
            if let Some(first) = items.first().cloned() {
                items.resize(2_048, first);
            }
        }
        Value::Object(map) => {
            if let Some((key, item)) = map.iter().next().map(|(k, v)| (k.clone(), v.clone())) {
                for i in 0..256 {
                    map.insert(format!("{key}{i}"), item.clone());
                }
            }
        }
        Value::Bool(b) => *node = Value::String(format!("{b}{}", "e".repeat(1_024))),
        Value::Null => *node = Value::String("x".repeat(65_536)),
    }
}

/// One of `valid` with one to four [`Mutation`]s at random places.
pub fn mutated_json(valid: Vec<Value>) -> BoxedStrategy<Value> {
    assert!(
        !valid.is_empty(),
        "mutations need a valid payload to start from"
    );
    mutated_from(proptest::sample::select(valid).boxed())
}

/// A value of `valid` (a strategy of valid payloads) with one to four [`Mutation`]s.
pub fn mutated_from(valid: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    (
        valid,
        proptest::collection::vec((any::<usize>(), mutation()), 1..=4),
    )
        .prop_map(|(mut value, changes)| {
            for (at, change) in &changes {
                apply(&mut value, *at, change);
            }
            value
        })
        .boxed()
}

/// Mostly [`mutated_json`] of `valid`, sometimes an arbitrary tree.
pub fn json_values(valid: Vec<Value>) -> BoxedStrategy<Value> {
    prop_oneof![
        4 => mutated_json(valid),
        1 => any_json(),
    ]
    .boxed()
}

/// Mostly [`mutated_from`] `valid`, sometimes an arbitrary tree.
pub fn json_values_from(valid: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![
        4 => mutated_from(valid),
        1 => any_json(),
    ]
    .boxed()
}

/// [`json_texts_from`] fixed valid payloads.
pub fn json_texts(valid: Vec<Value>) -> BoxedStrategy<Vec<u8>> {
    assert!(
        !valid.is_empty(),
        "mutations need a valid payload to start from"
    );
    json_texts_from(proptest::sample::select(valid).boxed())
}

/// JSON text as bytes: mutated payloads written out, then sometimes cut, spliced or flipped;
/// arbitrary bytes; nesting past any parser's depth; numbers past any type.
pub fn json_texts_from(valid: BoxedStrategy<Value>) -> BoxedStrategy<Vec<u8>> {
    let written = mutated_from(valid).prop_map(|v| serde_json::to_vec(&v).unwrap());
    prop_oneof![
        4 => written.clone(),
        3 => (written, any::<usize>(), any::<u8>(), 0u8..4).prop_map(|(mut bytes, at, byte, how)| {
            let i = at % (bytes.len() + 1);
            match how {
                0 => bytes.truncate(i),
                1 => bytes.insert(i, byte),
                2 if i < bytes.len() => {
                    bytes.remove(i);
                }
                _ if i < bytes.len() => bytes[i] ^= byte | 1,
                _ => bytes.push(byte),
            }
            bytes
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..256),
        1 => (1usize..=20_000).prop_map(|depth| {
            let mut text = "[".repeat(depth).into_bytes();
            text.extend("]".repeat(depth).into_bytes());
            text
        }),
        1 => proptest::sample::select(vec![
            "1e999999".to_owned(),
            "-1e999999".to_owned(),
            "9".repeat(10_000),
            format!("\"{}\"", "\\u0000".repeat(10_000)),
            "\"\\ud800\"".to_owned(),
            "{\"a\":1,\"a\":2}".to_owned(),
        ])
        .prop_map(String::into_bytes),
    ]
    .boxed()
}

/// `value` (an object) as a TOML document: scalars and arrays of scalars at the top, objects
/// as `[table]`s, arrays of objects as `[[table]]`s, anything deeper inline. `null` has no
/// TOML form: such a key is left out (a missing key). Keys are always quoted.
pub fn toml_text(value: &Value) -> String {
    let Value::Object(map) = value else {
        return format!("value = {}\n", toml_inline(value));
    };
    let mut text = String::new();
    let mut tables = String::new();
    for (key, item) in map {
        let quoted = serde_json::to_string(key).unwrap();
        match item {
            Value::Null => {}
            Value::Object(inner) => {
                tables.push_str(&format!("\n[{quoted}]\n"));
                tables.push_str(&toml_lines(inner));
            }
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
                for inner in items.iter().filter_map(Value::as_object) {
                    tables.push_str(&format!("\n[[{quoted}]]\n"));
                    tables.push_str(&toml_lines(inner));
                }
            }
            other => text.push_str(&format!("{quoted} = {}\n", toml_inline(other))),
        }
    }
    text + &tables
}

fn toml_lines(map: &Map<String, Value>) -> String {
    map.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            format!(
                "{} = {}\n",
                serde_json::to_string(k).unwrap(),
                toml_inline(v)
            )
        })
        .collect()
}

fn toml_inline(value: &Value) -> String {
    match value {
        // No TOML form: an empty inline table stands in (a wrong type where one is expected).
        Value::Null => "{}".into(),
        Value::Bool(b) => b.to_string(),
        // JSON numbers are TOML numbers (integers past i64 are a TOML error, as they should be).
        Value::Number(n) => n.to_string(),
        // JSON's string escapes are all TOML basic-string escapes.
        Value::String(s) => serde_json::to_string(s).unwrap(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(toml_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", serde_json::to_string(k).unwrap(), toml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutation_changes_a_payload_somewhere() {
        let valid =
            serde_json::json!({ "id": 7, "text": "hi", "tags": ["a"], "from": { "name": "ada" } });
        for mutation in [
            Mutation::Replace(Value::Bool(true)),
            Mutation::Remove,
            Mutation::Retype,
            Mutation::Stretch,
            Mutation::AddField("extra".into(), Value::Null),
            Mutation::Wrap(true),
        ] {
            let mut value = valid.clone();
            // Node 1: the root's first field.
            apply(&mut value, 1, &mutation);
            assert_ne!(value, valid, "{mutation:?} left the payload as it was");
        }
    }

    #[test]
    fn toml_text_of_a_config_tree_is_the_same_tree() {
        let tree = serde_json::json!({
            "state_dir": "/tmp/x\u{0}y",
            "gateway": { "listen": "127.0.0.1:0", "n": -3 },
            "agents": [{ "id": "main", "command": ["sh", "-c"] }],
            "sessions": { "a2a": { "enabled": true, "allow": ["ops-*"] } },
        });
        let text = toml_text(&tree);
        // TOML has no NUL in basic strings unescaped; JSON's `\u0000` escape is TOML's too.
        assert!(text.contains("\\u0000"), "{text}");
        assert!(text.contains("[[\"agents\"]]"), "{text}");
        assert!(text.contains("[\"sessions\"]"), "{text}");
    }
}
