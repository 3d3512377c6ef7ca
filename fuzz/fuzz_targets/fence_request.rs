//! The fence layer's header and resource extraction, driven through a `FenceLayer`-wrapped
//! tower service with arbitrary methods, paths and `Fencing-Token` headers.
//!
//! Never panics; every answer is one the `fence` module documents, decided as documented:
//! unchecked methods pass through; on a fenced resource an absent header is 428, anything
//! but exactly one decimal token below 2^63 (surrounding blanks allowed) is 400, a token
//! below the mark is 409 with a problem document naming the mark, else the request reaches
//! the service with a `VerifiedToken` for the percent-decoded path; advisory resources
//! (under `/legacy/`) always reach the service.

#![no_main]

use std::convert::Infallible;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use palisade_fence::{
    decoded_path, Enforcement, EnforcementTable, FenceLayer, FencingToken, MemoryStore,
    VerifiedToken, FENCING_TOKEN,
};
use tower::{Layer, ServiceExt};

#[derive(Debug, Arbitrary)]
struct Input {
    /// Sets the path's mark first, when given.
    mark: Option<u64>,
    method: u8,
    path: Vec<u8>,
    /// A `Fencing-Token` header near the mark: `mark + delta`, with leading zeros and
    /// blanks around it as `shape` says (so the fuzzer meets the mark's edges).
    near_mark: Option<(i8, u8)>,
    /// The values of more `Fencing-Token` headers (none, one, or several).
    tokens: Vec<Vec<u8>>,
    /// Another header, to check it is ignored.
    other: Vec<u8>,
}

const METHODS: [Method; 7] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
];

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

/// What the inner service saw: the token the layer verified, if any.
fn inner(req: Request<()>) -> Response<Bytes> {
    let verified = req.extensions().get::<VerifiedToken>().cloned();
    let mut response = Response::new(Bytes::from_static(b"inner"));
    if let Some(v) = verified {
        response.extensions_mut().insert(v);
    }
    response
}

/// The documented reading of the header: `Err` for anything but one well-formed token.
fn expected_token(values: &[HeaderValue]) -> Result<Option<u64>, ()> {
    match values {
        [] => Ok(None),
        [one] => {
            let text = one.as_bytes().trim_ascii();
            if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let value = text.iter().try_fold(0u64, |v, &d| {
                v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            });
            match value {
                Some(v) if v <= i64::MAX as u64 => Ok(Some(v)),
                _ => Err(()),
            }
        }
        _ => Err(()),
    }
}

fuzz_target!(|input: Input| {
    let Ok(uri) = Uri::try_from(input.path.as_slice()) else {
        return;
    };
    let mark = input
        .mark
        .map(|m| FencingToken::from_u64(m & i64::MAX as u64).unwrap());
    let mut values: Vec<HeaderValue> = Vec::new();
    if let (Some(m), Some((delta, shape))) = (mark, input.near_mark) {
        let near = m.get().saturating_add_signed(i64::from(delta));
        let text = format!(
            "{}{}{near}{}",
            [" ", "", "\t"][usize::from(shape % 3)],
            "0".repeat(usize::from(shape / 3 % 3)),
            [" ", "", "\t "][usize::from(shape / 9 % 3)]
        );
        values.push(HeaderValue::from_str(&text).unwrap());
    }
    values.extend(
        input
            .tokens
            .iter()
            .filter_map(|v| HeaderValue::from_bytes(v).ok()),
    );
    let method = METHODS[usize::from(input.method) % METHODS.len()].clone();

    let store = MemoryStore::new(1_000);
    let resource = decoded_path(&uri);
    if let Some(m) = mark {
        store.raise_now(&resource, m);
    }
    let table =
        EnforcementTable::new(Enforcement::Fenced).with_prefix("/legacy/", Enforcement::Advisory);
    let service = FenceLayer::new(store)
        .with_enforcement_table(table.clone())
        .layer(tower::service_fn(|req| async move {
            Ok::<_, Infallible>(inner(req))
        }));

    let mut request = Request::builder()
        .method(method.clone())
        .uri(uri)
        .body(())
        .unwrap();
    for v in &values {
        request.headers_mut().append(FENCING_TOKEN, v.clone());
    }
    if let Ok(v) = HeaderValue::from_bytes(&input.other) {
        request.headers_mut().append("x-other", v);
    }
    let response = runtime().block_on(service.oneshot(request)).unwrap();
    let status = response.status();
    let verified = response.extensions().get::<VerifiedToken>().cloned();

    let checked = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if !checked || table.resolve(&resource) == Enforcement::Advisory {
        assert_eq!(
            status,
            StatusCode::OK,
            "unchecked or advisory requests reach the service"
        );
        if !checked {
            assert!(verified.is_none());
        }
        return;
    }
    match expected_token(&values) {
        Ok(None) => assert_eq!(status, StatusCode::PRECONDITION_REQUIRED),
        Err(()) => assert_eq!(status, StatusCode::BAD_REQUEST),
        Ok(Some(t)) if mark.is_some_and(|m| t < m.get()) => {
            assert_eq!(status, StatusCode::CONFLICT);
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert_eq!(body["status"], 409);
            assert_eq!(body["highest"], mark.unwrap().to_string());
            assert_eq!(body["token"], t.to_string());
            assert_eq!(body["resource"], resource.as_str());
        }
        Ok(Some(t)) => {
            assert_eq!(status, StatusCode::OK);
            let verified = verified
                .as_ref()
                .expect("an admitted request carries its VerifiedToken");
            assert_eq!(verified.token.get(), t);
            assert_eq!(verified.resource, resource);
        }
    }
    if status != StatusCode::OK {
        assert!(
            verified.is_none(),
            "a refused request never reaches the service"
        );
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
});
