//! The lock service's JSON: the public serde types its request bodies and stored records
//! are made of, from arbitrary bytes.
//!
//! The request body structs themselves are private to the service, and its router cannot
//! be built without etcd (`Locker::connect` reads the epoch record from etcd), so this
//! target reads the parts they are built from: `Mode`, `Enforcement`, `QuorumPolicy`,
//! `Revision` and `FencingToken` (fields of the acquire, release and class bodies),
//! `LeaseId` and `SpiffeId`, and the `Namespace` and `LockClass` records the service
//! stores in etcd as JSON (with their millisecond durations).
//!
//! The input is either raw bytes, or a valid record (a namespace, a class, an acquire or a
//! release body) with some fields replaced, dropped or added, so that whole records parse
//! often enough to fuzz what comes after the first error.
//! Never panics; whatever parses serializes and parses back to the same value.

#![no_main]

use std::fmt::Debug;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use palisade_fence::{FencingToken, Revision};
use palisade_lock::{Enforcement, LeaseId, LockClass, Mode, Namespace, QuorumPolicy, SpiffeId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

const WORDS: [&str; 10] =
    ["exclusive", "shared", "fenced", "advisory", "closed", "open", "restore", "rehome", "spiffe://acme/w", ""];

#[derive(Debug, Arbitrary)]
enum Input<'a> {
    Raw(&'a [u8]),
    Record {
        /// Which valid record to start from.
        template: u8,
        /// Fields (by position) given another value.
        changes: Vec<(u8, Json)>,
        /// A field (by position) left out.
        drop: Option<u8>,
        /// A field added.
        extra: Option<(String, Json)>,
    },
}

#[derive(Debug, Arbitrary)]
enum Json {
    Word(u8),
    Str(String),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
    Null,
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Valid records: a namespace and a class as stored, an acquire and a release body.
fn template(which: u8) -> Vec<(&'static str, Value)> {
    let text = match which % 4 {
        0 => r#"{"id":"orders","tenant_id":"acme","held_lease_quota":10,"op_rate_quota":100,"cluster_tier":"default"}"#,
        1 => r#"{"id":"jobs","ns_id":"orders","key_prefix":"nightly/","ttl_min":1000,"ttl_max":60000,"mode":"exclusive","enforcement":"fenced","on_quorum_loss":"closed","lock_delay":0}"#,
        2 => r#"{"session":"00000000000000ab","namespace":"orders","class":"jobs","key":"nightly/1","mode":"shared","wait_ms":1000,"token":"281474976710757"}"#,
        _ => r#"{"session":"00000000000000ab","namespace":"orders","class":"jobs","key":"nightly/1","mode":"exclusive","grant_rev":4242}"#,
    };
    let Value::Object(map) = serde_json::from_str(text).unwrap() else { unreachable!() };
    // Field names of the templates above, in order, as `'static` keys.
    const NAMES: [&str; 22] = [
        "id", "ns_id", "tenant_id", "held_lease_quota", "op_rate_quota", "cluster_tier", "key_prefix", "ttl_min",
        "ttl_max", "mode", "enforcement", "on_quorum_loss", "lock_delay", "session", "namespace", "class", "key",
        "wait_ms", "grant_rev", "token", "reason", "ttl_ms",
    ];
    map.into_iter().map(|(k, v)| (*NAMES.iter().find(|n| **n == k).unwrap(), v)).collect()
}

fn object(fields: &[(String, Json)]) -> Value {
    Value::Object(fields.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
}

impl Json {
    fn to_value(&self) -> Value {
        match self {
            Json::Word(i) => WORDS[usize::from(*i) % WORDS.len()].into(),
            Json::Str(s) => s.as_str().into(),
            Json::Unsigned(n) => (*n).into(),
            Json::Signed(n) => (*n).into(),
            Json::Float(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
            Json::Bool(b) => (*b).into(),
            Json::Null => Value::Null,
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(fields) => object(fields),
        }
    }
}

/// Parses `data` as `T`; if it parses, the value round-trips through JSON.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let value: T = serde_json::from_slice(data).ok()?;
    let json = serde_json::to_vec(&value).expect("a parsed value serializes");
    let again: T = serde_json::from_slice(&json).expect("a serialized value parses");
    assert_eq!(again, value, "{}", String::from_utf8_lossy(&json));
    Some(value)
}

fuzz_target!(|input: Input<'_>| {
    let built;
    let data = match input {
        Input::Raw(bytes) => bytes,
        Input::Record { template: which, changes, drop, extra } => {
            let mut fields = template(which);
            for (at, value) in &changes {
                let n = fields.len();
                fields[usize::from(*at) % n].1 = value.to_value();
            }
            if let Some(at) = drop {
                fields.remove(usize::from(at) % fields.len());
            }
            let mut map: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            if let Some((name, value)) = extra {
                map.insert(name, value.to_value());
            }
            for value in map.values() {
                check(&serde_json::to_vec(value).unwrap());
            }
            built = serde_json::to_vec(&Value::Object(map)).unwrap();
            &built[..]
        }
    };
    check(data);
});

fn check(data: &[u8]) {
    round_trip::<Mode>(data);
    round_trip::<Enforcement>(data);
    round_trip::<QuorumPolicy>(data);
    round_trip::<Revision>(data);
    round_trip::<FencingToken>(data);
    round_trip::<LeaseId>(data);
    round_trip::<Namespace>(data);
    round_trip::<LockClass>(data);
    if let Some(id) = round_trip::<SpiffeId>(data) {
        // The wire form is not checked on the way in; the constructor's check must not
        // panic on whatever came in.
        let _ = SpiffeId::new(id.as_str());
    }
    // The acquire body's shape, with the public field types: a token in any JSON number
    // or string position never panics the reader.
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice::<serde_json::Value>(data) {
        for value in fields.values() {
            let _ = serde_json::from_value::<FencingToken>(value.clone());
            let _ = serde_json::from_value::<Mode>(value.clone());
        }
    }
}
