//! The lock service's JSON, from arbitrary bytes: the request body of every route with
//! one, parsed as its handler parses it, and the public serde types its bodies and stored
//! records are made of.
//!
//! The service's router cannot be built without etcd (`Locker::connect` reads the epoch
//! record), so the bodies go through `palisade_server::parse_body` (feature
//! `fuzzing`): the handler's own extractor and body type, then the handler's checks of
//! the body. Every body must be accepted or refused with an `invalid-input` problem.
//! The public types are `Mode`, `Enforcement`, `QuorumPolicy`, `Revision` and
//! `FencingToken` (fields of the bodies), `LeaseId` and `SpiffeId`, and the `Namespace`
//! and `LockClass` records the service stores in etcd as JSON (with their millisecond
//! durations): whatever parses serializes and parses back to the same value.
//!
//! The input is either raw bytes, or a valid body or record with some fields replaced,
//! dropped or added, so that whole bodies parse often enough to fuzz the checks after the
//! parse; it is sent with one of a few content types. Never panics.

#![no_main]

use std::fmt::Debug;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use palisade_fence::{FencingToken, Revision};
use palisade_server::{parse_body, BodyRoute, ProblemKind};
use palisade_lock::{Enforcement, LeaseId, LockClass, Mode, Namespace, QuorumPolicy, SpiffeId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

const WORDS: [&str; 10] = [
    "exclusive",
    "shared",
    "fenced",
    "advisory",
    "closed",
    "open",
    "restore",
    "rehome",
    "spiffe://acme/w",
    "",
];

/// Content types a body is sent with: JSON, JSON with a parameter, another type, none.
const CONTENT_TYPES: [Option<&str>; 4] = [
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("text/plain"),
    None,
];

#[derive(Debug, Arbitrary)]
struct Request<'a> {
    /// Which of [`CONTENT_TYPES`].
    content_type: u8,
    /// The path's namespace and class, for the admin routes: a valid name, or these bytes.
    path: Option<(&'a str, &'a str)>,
    input: Input<'a>,
}

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

/// Valid records: a namespace and a class as stored, then a valid body of each route.
fn template(which: u8) -> Vec<(&'static str, Value)> {
    let text = match which % 9 {
        0 => {
            r#"{"id":"orders","tenant_id":"acme","held_lease_quota":10,"op_rate_quota":100,"cluster_tier":"default"}"#
        }
        1 => {
            r#"{"id":"jobs","ns_id":"orders","key_prefix":"nightly/","ttl_min":1000,"ttl_max":60000,"mode":"exclusive","enforcement":"fenced","on_quorum_loss":"closed","lock_delay":0}"#
        }
        2 => {
            r#"{"session":"00000000000000ab","namespace":"orders","class":"jobs","key":"nightly/1","mode":"shared","wait_ms":1000,"holder_meta":{"job":"n1"}}"#
        }
        3 => {
            r#"{"session":"00000000000000ab","namespace":"orders","class":"jobs","key":"nightly/1","mode":"exclusive","grant_rev":4242}"#
        }
        4 => r#"{"ttl_ms":3000,"namespace":"orders"}"#,
        5 => {
            r#"{"tenant_id":"acme","held_lease_quota":10,"op_rate_quota":100,"cluster_tier":"default"}"#
        }
        6 => {
            r#"{"key_prefix":"nightly/","ttl_min_ms":1000,"ttl_max_ms":60000,"mode":"exclusive","enforcement":"fenced","on_quorum_loss":"closed","lock_delay_ms":0}"#
        }
        7 => r#"{"reason":"restore"}"#,
        _ => {
            r#"{"namespace":"orders","class":"jobs","key":"nightly/1","reason":"stuck after a crash"}"#
        }
    };
    let Value::Object(map) = serde_json::from_str(text).unwrap() else {
        unreachable!()
    };
    // Field names of the templates above, in order, as `'static` keys.
    const NAMES: [&str; 26] = [
        "id",
        "ns_id",
        "tenant_id",
        "held_lease_quota",
        "op_rate_quota",
        "cluster_tier",
        "key_prefix",
        "ttl_min",
        "ttl_max",
        "mode",
        "enforcement",
        "on_quorum_loss",
        "lock_delay",
        "session",
        "namespace",
        "class",
        "key",
        "wait_ms",
        "grant_rev",
        "token",
        "reason",
        "ttl_ms",
        "ttl_min_ms",
        "ttl_max_ms",
        "lock_delay_ms",
        "holder_meta",
    ];
    map.into_iter()
        .map(|(k, v)| (*NAMES.iter().find(|n| **n == k).unwrap(), v))
        .collect()
}

fn object(fields: &[(String, Json)]) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|(k, v)| (k.clone(), v.to_value()))
            .collect(),
    )
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

fuzz_target!(|request: Request<'_>| {
    let content_type = CONTENT_TYPES[usize::from(request.content_type) % CONTENT_TYPES.len()];
    let (ns, class) = request.path.unwrap_or(("orders", "jobs"));
    let built;
    let data = match request.input {
        Input::Raw(bytes) => bytes,
        Input::Record {
            template: which,
            changes,
            drop,
            extra,
        } => {
            let mut fields = template(which);
            for (at, value) in &changes {
                let n = fields.len();
                fields[usize::from(*at) % n].1 = value.to_value();
            }
            if let Some(at) = drop {
                fields.remove(usize::from(at) % fields.len());
            }
            let mut map: Map<String, Value> =
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
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
    for route in BodyRoute::ALL {
        if let Err(problem) = parse_body(route, ns, class, content_type, data) {
            assert_eq!(
                problem.kind(),
                ProblemKind::InvalidInput,
                "{route:?}: {problem:?}"
            );
        }
    }
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
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice::<serde_json::Value>(data)
    {
        for value in fields.values() {
            let _ = serde_json::from_value::<FencingToken>(value.clone());
            let _ = serde_json::from_value::<Mode>(value.clone());
        }
    }
}
