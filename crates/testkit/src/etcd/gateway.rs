//! A minimal HTTP/1.0 client for etcd's `/health` and JSON gateway (`/v3/...`).
//!
//! It keeps the test kit free of an HTTP or gRPC client: every call is one short-lived
//! connection, `Connection: close`, the body read to its end.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for one gateway call. A member without quorum answers writes only after
/// about 7 s; callers retry elsewhere instead.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a member says about itself (`POST /v3/maintenance/status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// The answering member's id.
    pub member_id: u64,
    /// The cluster id.
    pub cluster_id: u64,
    /// The member id this member takes for the leader; 0 when it knows none.
    pub leader: u64,
    /// The store's current revision on this member.
    pub revision: i64,
    /// The raft term this member is in.
    pub raft_term: u64,
}

/// A failed gateway call: transport error, timeout, non-200 status or unexpected JSON.
#[derive(Debug)]
pub(crate) struct CallError(pub(crate) String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

async fn raw(addr: SocketAddr, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of HTTP headers"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP status code"))?;
    Ok((code, body.to_owned()))
}

/// Sends one request and parses a 200 response's JSON body.
pub(crate) async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<Value, CallError> {
    let (code, text) = match tokio::time::timeout(CALL_TIMEOUT, raw(addr, method, path, body)).await
    {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Err(CallError(format!("{method} {addr}{path}: {e}"))),
        Err(_) => {
            return Err(CallError(format!(
                "{method} {addr}{path}: no answer in {CALL_TIMEOUT:?}"
            )))
        }
    };
    if code != 200 {
        return Err(CallError(format!(
            "{method} {addr}{path}: HTTP {code}: {}",
            text.trim()
        )));
    }
    serde_json::from_str(&text)
        .map_err(|e| CallError(format!("{method} {addr}{path}: {e}: {text}")))
}

/// `GET /health`: true when the member has a leader, no alarm, and serves a read.
pub(crate) async fn healthy(addr: SocketAddr) -> bool {
    matches!(call(addr, "GET", "/health", "").await, Ok(v) if v["health"] == "true")
}

/// `POST /v3/maintenance/status` on one member.
pub(crate) async fn status(addr: SocketAddr) -> Result<MemberStatus, CallError> {
    let v = call(addr, "POST", "/v3/maintenance/status", "{}").await?;
    let header = &v["header"];
    let parsed = (|| {
        Some(MemberStatus {
            member_id: num(&header["member_id"])?,
            cluster_id: num(&header["cluster_id"])?,
            leader: num(&v["leader"]).unwrap_or(0),
            revision: num(&header["revision"])?,
            raft_term: num(&header["raft_term"])?,
        })
    })();
    parsed.ok_or_else(|| CallError(format!("unexpected status answer from {addr}: {v}")))
}

/// `POST /v3/cluster/member/list`: (name, id) of every member.
pub(crate) async fn member_ids(addr: SocketAddr) -> Result<Vec<(String, u64)>, CallError> {
    let v = call(addr, "POST", "/v3/cluster/member/list", "{}").await?;
    let members = v["members"]
        .as_array()
        .ok_or_else(|| CallError(format!("no members in {v}")))?;
    members
        .iter()
        .map(|m| match (m["name"].as_str(), num(&m["ID"])) {
            (Some(name), Some(id)) => Ok((name.to_owned(), id)),
            _ => Err(CallError(format!("unexpected member in {v}"))),
        })
        .collect()
}

/// `POST /v3/kv/put`; the revision of the put.
pub(crate) async fn put(addr: SocketAddr, key: &str, value: &str) -> Result<i64, CallError> {
    let body =
        serde_json::json!({ "key": encode(key.as_bytes()), "value": encode(value.as_bytes()) });
    let v = call(addr, "POST", "/v3/kv/put", &body.to_string()).await?;
    num(&v["header"]["revision"]).ok_or_else(|| CallError(format!("no revision in {v}")))
}

/// `POST /v3/kv/range` (linearizable) for one key; its value, if any.
pub(crate) async fn get(addr: SocketAddr, key: &str) -> Result<Option<String>, CallError> {
    let body = serde_json::json!({ "key": encode(key.as_bytes()) });
    let v = call(addr, "POST", "/v3/kv/range", &body.to_string()).await?;
    let Some(kv) = v["kvs"].as_array().and_then(|kvs| kvs.first()) else {
        return Ok(None);
    };
    // An empty value is left out of the JSON.
    let value = kv["value"].as_str().unwrap_or("");
    let bytes = decode(value).ok_or_else(|| CallError(format!("bad base64 value in {v}")))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The gateway prints 64-bit integers as strings.
fn num<T: std::str::FromStr>(v: &Value) -> Option<T> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as the gateway wants for `bytes` fields.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
        ];
        for (plain, coded) in cases {
            assert_eq!(encode(plain.as_bytes()), coded);
            assert_eq!(decode(coded).unwrap(), plain.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
    }
}
