//! `GET /v1/openapi.json`: the document lists exactly the routes the router serves, its
//! problem responses name the stable `type`s, and its request schemas refuse what the
//! handlers refuse.

use std::collections::BTreeSet;

use palisade_server::ProblemKind;
use serde_json::{json, Value};

use super::{acquire_body, call, call_raw, fixture, keys, open, OWNER};

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

/// A concrete path for a route: parameters replaced by sample values.
fn concrete(path: &str) -> String {
    path.replace("{session}", "0000000000000001")
        .replace("{ns}", "ns")
        .replace("{class}", "c")
        .replace("{id}", "no-such-request")
}

/// The validator of one component schema of `doc` (references resolve inside `doc`).
fn validator(doc: &Value, schema: &str) -> jsonschema::Validator {
    let mut root = doc.clone();
    root["$ref"] = json!(format!("#/components/schemas/{schema}"));
    jsonschema::draft202012::new(&root).unwrap()
}

#[tokio::test]
async fn etcd_openapi_document_matches_the_router_and_its_schemas_refuse_what_handlers_refuse() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;

    // Served without an identity, as JSON, OpenAPI 3.1.
    let r = call_raw(addr, "GET", "/v1/openapi.json", None, Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.content_type, "application/json");
    let doc = r.body;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert_eq!(
        serde_json::from_str::<Value>(&palisade_server::openapi_json()).unwrap(),
        doc
    );

    // (method, path) of the document == the router's route table.
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            if METHODS.contains(&method.to_uppercase().as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let routed: BTreeSet<(String, String)> = palisade_server::routes()
        .into_iter()
        .map(|(m, p)| (m.as_str().to_owned(), p.to_owned()))
        .collect();
    assert_eq!(documented, routed);
    assert_eq!(routed.len(), 17);

    // The router really serves each of them (its fallbacks answer "no such route" or
    // 405), and nothing else on those paths.
    let paths: BTreeSet<&String> = routed.iter().map(|(_, p)| p).collect();
    for path in paths {
        for method in METHODS {
            let r = call_raw(addr, method, &concrete(path), Some(OWNER), Vec::new()).await;
            let served = routed.contains(&(method.to_owned(), path.clone()));
            if served {
                assert_ne!(r.status, 405, "{method} {path}: {:?}", r.body);
                assert_ne!(r.body["detail"], "no such route", "{method} {path}");
            } else {
                assert_eq!(
                    r.status, 405,
                    "{method} {path} is not documented: {:?}",
                    r.body
                );
            }
        }
    }

    // Problems: the Problem schema names every stable type; each route's error
    // responses are problem+json with types of that status only.
    let all: BTreeSet<String> = ProblemKind::ALL.iter().map(|k| k.type_uri()).collect();
    let problem = &doc["components"]["schemas"]["Problem"];
    let listed: BTreeSet<String> = problem["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, all);
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let open = path == "/metrics" || path == "/v1/openapi.json";
            let responses = op["responses"].as_object().unwrap();
            assert_eq!(
                responses.contains_key("401"),
                !open,
                "{method} {path}: 401 documented iff an identity is needed"
            );
            for (status, resp) in responses {
                let status: u16 = status.parse().unwrap();
                if status < 400 {
                    continue;
                }
                let schema = &resp["content"]["application/problem+json"]["schema"];
                assert_eq!(schema["allOf"][0]["$ref"], "#/components/schemas/Problem");
                for t in schema["allOf"][1]["properties"]["type"]["enum"]
                    .as_array()
                    .unwrap()
                {
                    let kind = ProblemKind::ALL
                        .iter()
                        .find(|k| k.type_uri() == t.as_str().unwrap())
                        .unwrap_or_else(|| panic!("{method} {path}: unknown type {t}"));
                    assert!(
                        kind.status().as_u16() == status
                            || (*kind == ProblemKind::InvalidInput
                                && [413, 415, 422].contains(&status)),
                        "{method} {path}: {t} under {status}"
                    );
                    seen.insert(kind.type_uri());
                }
                if status == 429 {
                    assert!(resp["headers"]["Retry-After"].is_object());
                }
            }
        }
    }
    assert_eq!(seen, all, "every problem kind is documented on some route");
    assert_eq!(
        doc["components"]["securitySchemes"]["mtls"]["type"],
        "mutualTLS"
    );

    // Request schemas refuse what the handlers refuse, and accept what they accept.
    let session = open(addr, OWNER, 10_000).await;
    let acquire = validator(&doc, "AcquireBody");
    let good = acquire_body(&session, "k-openapi", 1_000);
    assert!(acquire.is_valid(&good));
    let mut bad = Vec::new();
    let mut with = |edit: &dyn Fn(&mut Value)| {
        let mut b = good.clone();
        edit(&mut b);
        bad.push(b);
    };
    with(&|b| b["unknown"] = json!(1));
    with(&|b| {
        b.as_object_mut().unwrap().remove("wait_ms");
    });
    with(&|b| b["wait_ms"] = json!(-5));
    assert!(
        acquire.is_valid(&acquire_body(&session, "k-openapi", 0)),
        "wait_ms 0 tries once"
    );
    with(&|b| b["wait_ms"] = json!("1000"));
    with(&|b| b["mode"] = json!("sideways"));
    with(&|b| b["session"] = json!("not-a-session"));
    with(&|b| b["namespace"] = json!("Bad Name"));
    with(&|b| b["key"] = json!(""));
    with(&|b| b["key"] = json!("k".repeat(513)));
    let before = keys(&f).await;
    for b in &bad {
        assert!(!acquire.is_valid(b), "schema accepts {b}");
        let r = call(addr, "POST", "/v1/locks/acquire", OWNER, b.clone()).await;
        assert!(
            (400..500).contains(&r.status),
            "{b}: {} {:?}",
            r.status,
            r.body
        );
        assert_eq!(r.content_type, "application/problem+json");
    }
    assert_eq!(keys(&f).await, before, "refused acquires wrote nothing");
    let r = call(addr, "POST", "/v1/locks/acquire", OWNER, good).await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    let open_schema = validator(&doc, "OpenSessionBody");
    assert!(open_schema.is_valid(&json!({ "ttl_ms": 5000 })));
    for b in [
        json!({ "ttl_ms": -1000 }),
        json!({ "ttl_ms": 5000, "owner": "me" }),
        json!({}),
        json!({ "ttl_ms": 1.5 }),
    ] {
        assert!(!open_schema.is_valid(&b), "schema accepts {b}");
        let r = call(addr, "POST", "/v1/sessions", OWNER, b.clone()).await;
        assert!((400..500).contains(&r.status), "{b}: {:?}", r.body);
    }

    let class = validator(&doc, "ClassBody");
    assert!(class.is_valid(&json!({ "key_prefix": "a/", "mode": "shared" })));
    let b = json!({ "key_prefix": "a/", "ttl": 5 });
    assert!(!class.is_valid(&b));
    let r = call(addr, "PUT", "/v1/namespaces/ns/classes/d", super::ADMIN, b).await;
    assert_eq!(r.status, 422, "{:?}", r.body);
}

/// The text fields' schemas (`TEXT_PATTERN` and the bounds) accept exactly what
/// `validate_text` accepts: every character of the Basic Multilingual Plane alone and
/// amid text, and samples at the bounds. `maxLength` counts characters and the bound
/// bytes, so the samples at the bounds are ASCII.
#[test]
fn text_field_schemas_agree_with_validate_text() {
    let doc: Value = serde_json::from_str(&palisade_server::openapi_json()).unwrap();
    let fields = [
        ("ForceRequestBody", "reason", palisade_api::MAX_REASON_LEN),
        ("NamespaceBody", "tenant_id", palisade_api::MAX_LABEL_LEN),
        ("NamespaceBody", "cluster_tier", palisade_api::MAX_LABEL_LEN),
    ];
    let mut samples = vec![
        "stuck batch job".to_owned(),
        "ü, ß und 中文 🔒".to_owned(),
        " padded ".to_owned(),
        String::new(),
        "\u{1b}[31m".to_owned(),
        "two\nlines".to_owned(),
    ];
    for c in (0..=0xffff_u32).filter_map(char::from_u32) {
        samples.push(c.to_string());
        samples.push(format!("a{c}b"));
    }
    for (schema, field, max) in fields {
        let prop = &doc["components"]["schemas"][schema]["properties"][field];
        assert_eq!(
            prop["pattern"],
            palisade_api::TEXT_PATTERN,
            "{schema}.{field}"
        );
        let v = jsonschema::draft202012::new(prop).unwrap();
        for s in samples
            .iter()
            .cloned()
            .chain(["x".repeat(max), "x".repeat(max + 1)])
        {
            assert_eq!(
                v.is_valid(&json!(s)),
                palisade_api::validate_text(field, &s, max).is_ok(),
                "{schema}.{field}: {s:?}"
            );
        }
    }
    let approve = &doc["paths"]["/v1/force-releases/{id}/approve"]["post"]["parameters"][0];
    assert_eq!(approve["schema"]["pattern"], palisade_api::TEXT_PATTERN);
    assert_eq!(
        approve["schema"]["maxLength"],
        palisade_api::MAX_REQUEST_ID_LEN
    );
}

/// The quotas are `u32`: the schema's bounds are the type's (utoipa's default for `u32`,
/// `format: int32`, says at most 2^31 - 1, and the handlers accept more).
#[test]
fn quota_schemas_state_the_u32_range_the_handlers_accept() {
    let doc: Value = serde_json::from_str(&palisade_server::openapi_json()).unwrap();
    for field in ["held_lease_quota", "op_rate_quota"] {
        for schema in ["NamespaceBody", "Namespace"] {
            let prop = &doc["components"]["schemas"][schema]["properties"][field];
            let v = jsonschema::draft202012::new(prop).unwrap();
            for (n, ok) in [(0_u64, true), (1 << 31, true), (u64::from(u32::MAX), true)] {
                assert_eq!(v.is_valid(&json!(n)), ok, "{schema}.{field} {n}");
            }
            assert!(!v.is_valid(&json!(u64::from(u32::MAX) + 1)));
            assert!(!v.is_valid(&json!(-1)));
        }
        let body = |n: u64| json!({ "tenant_id": "t", field: n });
        let parse = |n| serde_json::from_value::<palisade_api::wire::NamespaceBody>(body(n));
        assert!(parse(1 << 31).is_ok() && parse(u64::from(u32::MAX)).is_ok());
        assert!(parse(u64::from(u32::MAX) + 1).is_err());
    }
}

/// An epoch advance runs out of its time budget as `deadline-exceeded` (409), besides
/// `epoch-exhausted`; the document lists both under 409 (schemathesis saw the first
/// undocumented, seed 1).
#[test]
fn advance_epoch_documents_deadline_exceeded() {
    let doc: Value = serde_json::from_str(&palisade_server::openapi_json()).unwrap();
    let conflict = &doc["paths"]["/v1/epoch/advance"]["post"]["responses"]["409"];
    let types: BTreeSet<&str> = conflict["content"]["application/problem+json"]["schema"]["allOf"]
        [1]["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        BTreeSet::from([
            "urn:palisade:problem:deadline-exceeded",
            "urn:palisade:problem:epoch-exhausted"
        ])
    );
}
