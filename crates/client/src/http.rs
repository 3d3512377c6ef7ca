//! One JSON request to the service.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{ClientError, ClientErrorKind};
use crate::tls::ClientTls;

/// The identity header of the service's dev mode.
const DEV_IDENTITY_HEADER: &str = "x-palisade-dev-identity";

#[derive(Clone)]
pub(crate) struct Http {
    transport: Transport,
    base: String,
    identity: Option<String>,
}

/// Plain HTTP (dev mode) or mTLS.
#[derive(Clone)]
enum Transport {
    Plain(HyperClient<HttpConnector, Full<Bytes>>),
    Tls(HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

#[derive(Deserialize)]
struct ProblemBody {
    r#type: String,
    #[serde(default)]
    detail: String,
}

impl Http {
    /// The service's base URL, without a trailing `/`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Plain HTTP to `base` (`http://...`).
    pub(crate) fn new(base: String) -> Self {
        Http {
            transport: Transport::Plain(HyperClient::builder(TokioExecutor::new()).build_http()),
            base: base.trim_end_matches('/').to_owned(),
            identity: None,
        }
    }

    /// mTLS to `base` (`https://...`): HTTPS only, HTTP/1.1.
    pub(crate) fn new_tls(base: String, tls: &ClientTls) -> Result<Self, ClientError> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.config()?)
            .https_only()
            .enable_http1()
            .build();
        Ok(Http {
            transport: Transport::Tls(HyperClient::builder(TokioExecutor::new()).build(connector)),
            base: base.trim_end_matches('/').to_owned(),
            identity: None,
        })
    }

    pub(crate) fn set_identity(&mut self, id: String) {
        self.identity = Some(id);
    }

    /// Sends `body` (JSON, or nothing) and decodes a JSON answer, or `()` from an empty
    /// one (`T = serde::de::IgnoredAny` style callers use [`Http::send_empty`]).
    pub(crate) async fn send<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let bytes = self.raw(method, path, body).await?;
        serde_json::from_slice(&bytes.1).map_err(|e| ClientError::decode(bytes.0, e.to_string()))
    }

    /// Sends and decodes any JSON answer; an empty answer is `null`.
    pub(crate) async fn send_value(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, ClientError> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::decode(status, e.to_string()))
    }

    /// Sends and expects a success without a body.
    pub(crate) async fn send_empty(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(), ClientError> {
        self.raw(method, path, body).await.map(drop)
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, Bytes), ClientError> {
        let bytes = body
            .map(|b| serde_json::to_vec(&b).unwrap_or_default())
            .unwrap_or_default();
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(id) = &self.identity {
            req = req.header(DEV_IDENTITY_HEADER, id);
        }
        let req = req
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| ClientError::transport(&self.base, e))?;
        let resp = match &self.transport {
            Transport::Plain(c) => c.request(req).await,
            Transport::Tls(c) => c.request(req).await,
        }
        .map_err(|e| ClientError::transport(&self.base, e))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::transport(&self.base, e))?
            .to_bytes();
        if (200..300).contains(&status) {
            return Ok((status, body));
        }
        match serde_json::from_slice::<ProblemBody>(&body) {
            Ok(p) => Err(ClientError {
                kind: ClientErrorKind::from_type(&p.r#type),
                status: Some(status),
                detail: p.detail,
                source: None,
            }),
            Err(_) => Err(ClientError::decode(
                status,
                not_a_problem(&self.base, &body),
            )),
        }
    }
}

/// The detail of an error answer that is no problem document: most likely `base` is not
/// a Palisade lock service (an audit dashboard, a proxy's page). Names the URL and shows
/// the start of the body, escaped.
fn not_a_problem(base: &str, body: &[u8]) -> String {
    const SHOWN: usize = 200;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return format!(
            "{base} sent no problem document (an empty body): is it a Palisade lock service?"
        );
    }
    let shown: String = text.chars().take(SHOWN).collect();
    let more = if shown.len() < text.len() { "..." } else { "" };
    format!(
        "{base} sent no problem document: is it a Palisade lock service? It sent {:?}{more}",
        shown
    )
}
