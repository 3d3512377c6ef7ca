//! The fuzzing entry point (feature `fuzzing`, hidden from the docs): a JSON request body
//! of each route, parsed as its handler parses it, without a router or etcd.
//!
//! [`parse_body`] runs the handler's own extractor (`Body<T>`: axum's `Json` with
//! problem rejections, so the `Content-Type` check and the serde errors are the real ones)
//! into the handler's own body type, then the handler's checks of the body, in the
//! handler's order, with the service's default limits ([`ServiceOptions::new`]): the
//! shared `session_ttl`, `acquire_wait` and `check_reason`, name and key validation,
//! [`HolderMeta::new`], and for the admin routes the [`Namespace`] or [`LockClass`]
//! the handler builds and its validation (what `ConfigStore::put_*` checks before it
//! writes). What needs etcd or the caller (authorization, the session, quotas) is
//! skipped. The router's body-size layer (16 KiB by default) is not applied either;
//! bound the input below it.
//!
//! [`ServiceOptions::new`]: super::super::ServiceOptions::new

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::extract::FromRequest;
use axum::http::{header, Request};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::extract::Body;
use super::{force, locks, sessions, ApiResult};
use crate::problem::Problem;
use palisade_api::HolderMeta;
use palisade_api::{validate_name, Enforcement, LockClass, Mode, Namespace, QuorumPolicy};

/// A route that takes a JSON body.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyRoute {
    /// `POST /v1/sessions`.
    OpenSession,
    /// `POST /v1/locks/acquire`.
    Acquire,
    /// `POST /v1/locks/release`.
    Release,
    /// `PUT /v1/namespaces/{ns}`.
    PutNamespace,
    /// `PUT /v1/namespaces/{ns}/classes/{class}`.
    PutClass,
    /// `POST /v1/epoch/advance`.
    AdvanceEpoch,
    /// `POST /v1/force-releases`.
    RequestForceRelease,
}

impl BodyRoute {
    /// Every route with a JSON body.
    pub const ALL: [BodyRoute; 7] = [
        BodyRoute::OpenSession,
        BodyRoute::Acquire,
        BodyRoute::Release,
        BodyRoute::PutNamespace,
        BodyRoute::PutClass,
        BodyRoute::AdvanceEpoch,
        BodyRoute::RequestForceRelease,
    ];
}

/// Parses `body` (sent with `content_type`, if any) as the handler of `route` does; `ns`
/// and `class` are the path parameters of the admin routes (ignored by the others).
///
/// # Errors
///
/// The [`Problem`] the handler answers before it talks to etcd: 415 without a JSON
/// content type, 400 for bad JSON, 422 for JSON of another shape, 400 `invalid-input`
/// for a value the handler's checks refuse.
#[doc(hidden)]
pub fn parse_body(
    route: BodyRoute,
    ns: &str,
    class: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(), Problem> {
    match route {
        BodyRoute::OpenSession => {
            let _: palisade_api::wire::OpenSessionBody = extract(content_type, body)?;
            let v = fields::<palisade_api::wire::OpenSessionBody>(body);
            sessions::session_ttl(u64_of(&v, "ttl_ms"), default_max_ttl())?;
            if let Some(ns) = v.get("namespace").and_then(Value::as_str) {
                validate_name(ns)?;
            }
        }
        BodyRoute::Acquire => {
            let _: palisade_api::wire::AcquireBody = extract(content_type, body)?;
            let v = fields::<palisade_api::wire::AcquireBody>(body);
            locks::acquire_wait(u64_of(&v, "wait_ms"), default_max_wait())?;
            if let Some(Value::Object(meta)) = v.get("holder_meta") {
                HolderMeta::new(meta.clone())?;
            }
            names(&v)?;
        }
        BodyRoute::Release => {
            let _: palisade_api::wire::ReleaseBody = extract(content_type, body)?;
            // `rate_check` names the namespace first; `release_by` checks the lock.
            names(&fields::<palisade_api::wire::ReleaseBody>(body))?;
        }
        BodyRoute::PutNamespace => {
            let _: palisade_api::wire::NamespaceBody = extract(content_type, body)?;
            let v = fields::<palisade_api::wire::NamespaceBody>(body);
            let mut n = Namespace::new(ns, str_of(&v, "tenant_id"));
            // The body type's quotas are u32.
            if let Some(q) = v.get("held_lease_quota").and_then(Value::as_u64) {
                n.held_lease_quota = u32::try_from(q).unwrap_or(u32::MAX);
            }
            if let Some(q) = v.get("op_rate_quota").and_then(Value::as_u64) {
                n.op_rate_quota = u32::try_from(q).unwrap_or(u32::MAX);
            }
            if let Some(t) = v.get("cluster_tier").and_then(Value::as_str) {
                n.cluster_tier = t.to_owned();
            }
            n.validate()?;
        }
        BodyRoute::PutClass => {
            let _: palisade_api::wire::ClassBody = extract(content_type, body)?;
            let v = fields::<palisade_api::wire::ClassBody>(body);
            let mut c = LockClass::new(ns, class, str_of(&v, "key_prefix"));
            if let Some(ms) = v.get("ttl_min_ms").and_then(Value::as_u64) {
                c.ttl_min = Duration::from_millis(ms);
            }
            if let Some(ms) = v.get("ttl_max_ms").and_then(Value::as_u64) {
                c.ttl_max = Duration::from_millis(ms);
            }
            if let Some(m) = typed::<Mode>(&v, "mode") {
                c.mode = m;
            }
            if let Some(e) = typed::<Enforcement>(&v, "enforcement") {
                c.enforcement = e;
            }
            if let Some(q) = typed::<QuorumPolicy>(&v, "on_quorum_loss") {
                c.on_quorum_loss = q;
            }
            if let Some(ms) = v.get("lock_delay_ms").and_then(Value::as_u64) {
                c.lock_delay = Duration::from_millis(ms);
            }
            c.validate()?;
        }
        BodyRoute::AdvanceEpoch => {
            let _: palisade_api::wire::AdvanceBody = extract(content_type, body)?;
        }
        BodyRoute::RequestForceRelease => {
            let _: palisade_api::wire::ForceRequestBody = extract(content_type, body)?;
            let v = fields::<palisade_api::wire::ForceRequestBody>(body);
            names(&v)?;
            force::check_reason(&str_of(&v, "reason"))?;
        }
    }
    Ok(())
}

fn default_max_ttl() -> Duration {
    Duration::from_secs(3600)
}

fn default_max_wait() -> Duration {
    Duration::from_secs(60)
}

/// The handler's extractor, on a request carrying `body`.
fn extract<T: DeserializeOwned>(content_type: Option<&str>, body: &[u8]) -> ApiResult<T> {
    let mut req = Request::builder().method("POST").uri("/");
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let req = req
        .body(axum::body::Body::from(body.to_vec()))
        .map_err(|e| Problem::new(palisade_api::ProblemKind::InvalidInput, e.to_string()))?;
    let Body(value) = ready(Body::<T>::from_request(req, &()))?;
    Ok(value)
}

/// Runs a future that never waits (the body is in memory) to its end.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// The body's fields by name. The body types keep theirs private, so the values are read
/// again from the JSON the body type `T` has just accepted: an object with these fields,
/// or (serde reads a struct from an array too) their values in declaration order.
fn fields<T: DeserializeOwned>(body: &[u8]) -> Map<String, Value> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => map,
        Ok(Value::Array(items)) => field_names::<T>()
            .iter()
            .map(|n| (*n).to_owned())
            .zip(items)
            .collect(),
        _ => Map::new(),
    }
}

/// The field names `T`'s `Deserialize` derive reads, in declaration order.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::value::Error;
    use serde::de::{Error as _, Visitor};

    /// A deserializer that only notes the fields a struct asks for.
    struct Names<'a>(&'a mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for Names<'_> {
        type Error = Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            *self.0 = fields;
            Err(Error::custom("names noted"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

fn u64_of(v: &Map<String, Value>, name: &str) -> u64 {
    // The body type has this field, a u64.
    v.get(name).and_then(Value::as_u64).unwrap_or_default()
}

fn str_of(v: &Map<String, Value>, name: &str) -> String {
    v.get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn typed<T: DeserializeOwned>(v: &Map<String, Value>, name: &str) -> Option<T> {
    v.get(name)
        .cloned()
        .and_then(|x| serde_json::from_value(x).ok())
}

/// `namespace`, `class` and `key`, checked as the handlers check a lock's name.
fn names(v: &Map<String, Value>) -> ApiResult<()> {
    validate_name(&str_of(v, "namespace"))?;
    validate_name(&str_of(v, "class"))?;
    palisade_api::validate_key(&str_of(v, "key"))?;
    Ok(())
}
