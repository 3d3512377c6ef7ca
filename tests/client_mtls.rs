//! The Rust client over mTLS against the lock service on loopback and real etcd members
//! started by the test harness, with a CA and SVIDs made by rcgen (every test here
//! starts etcd: `etcd` in each name).

mod common;

use palisade_api::ProblemKind;
use std::time::Duration;

use common::pki::Pki;
use palisade_client::{Client, ClientErrorKind, ClientTls};
use palisade_lock::{LockClass, LockName, Mode, Namespace};
use palisade_server::testing::{serve_tls_on_loopback, ServiceFixture};
use palisade_server::{Authz, AuthzConfig, ServiceOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

const OWNER: &str = "spiffe://test/billing/a";
const OTHER: &str = "spiffe://test/billing/b";

struct Fixture {
    service: ServiceFixture,
    pki: Pki,
    url: String,
}

/// etcd, namespace `ns` with class `c`, and the service over mTLS (not dev mode).
async fn fixture() -> Fixture {
    let service = ServiceFixture::start(1, Duration::from_secs(1))
        .await
        .unwrap();
    service
        .configure(&Namespace::new("ns", "t"), &LockClass::new("ns", "c", ""))
        .await
        .unwrap();
    let authz = AuthzConfig::from_toml(
        "admins = [\"spiffe://test/ops\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/billing/\"]\nclasses = [\"c\"]\n",
    )
    .unwrap();
    let pki = Pki::new("test CA");
    let server = pki.server();
    let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let roots = CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let tls = palisade_server::server_config(roots, chain, key).unwrap();
    let options = ServiceOptions::new(Authz::fixed(authz));
    let served = serve_tls_on_loopback(service.locker.clone(), tls, options)
        .await
        .unwrap();
    Fixture {
        url: served.url(),
        service,
        pki,
    }
}

/// A client with an SVID for `uris`, from PEM in memory.
fn client_with(f: &Fixture, uris: &[&str]) -> Client {
    let svid = f.pki.client(uris);
    let tls = ClientTls::from_ca_pem(f.pki.ca_pem().as_bytes())
        .unwrap()
        .with_identity_pem(svid.cert_pem.as_bytes(), svid.key_pem.as_bytes())
        .unwrap();
    Client::new_mtls(f.url.clone(), tls).unwrap()
}

#[tokio::test]
async fn etcd_client_mtls_acquires_as_its_spiffe_id_and_foreign_ids_get_403() {
    let f = fixture().await;
    // The owner's SVID from PEM files, as a deployment mounts them.
    let files = f.pki.client(&[OWNER]).files(f.service.dir(), "owner");
    let tls = ClientTls::from_ca_file(f.pki.ca_file(f.service.dir()))
        .unwrap()
        .with_identity_files(&files.cert, &files.key)
        .unwrap();
    let owner = Client::new_mtls(f.url.clone(), tls).unwrap();
    let session = owner.open_session(Duration::from_secs(5)).await.unwrap();
    let hold = session
        .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(2))
        .await
        .unwrap();
    let token = hold.token().expect("a fenced class gives a token");
    assert_eq!(token.revision(), hold.grant_rev().unwrap());

    // The service saw the certificate's SPIFFE ID as the holder.
    let status = owner
        .call_json("GET", "/v1/locks/status?namespace=ns&class=c&key=k", None)
        .await
        .unwrap();
    assert_eq!(status["holders"][0]["spiffe_id"], OWNER);
    assert_eq!(status["holders"][0]["token"], token.to_string());
    assert_eq!(status["holders"][0]["session"], session.id());

    // Another SVID of the same CA, allowed to lock the class, cannot touch the session:
    // a typed 403 from keepalive, release and close.
    let other = client_with(&f, &[OTHER]);
    let path = format!("/v1/sessions/{}/keepalive", session.id());
    let e = other.call_json("POST", &path, None).await.unwrap_err();
    assert_eq!(
        e.kind(),
        &ClientErrorKind::Problem(ProblemKind::Forbidden),
        "{e}"
    );
    assert_eq!(e.status(), Some(403));
    assert!(e.is_forbidden());
    let release = json!({ "session": session.id(), "namespace": "ns", "class": "c", "key": "k",
        "mode": "exclusive", "grant_rev": hold.grant_rev().unwrap() });
    let e = other
        .call_json("POST", "/v1/locks/release", Some(release))
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (&ClientErrorKind::Problem(ProblemKind::Forbidden), Some(403))
    );
    let e = other
        .call_json("DELETE", &format!("/v1/sessions/{}", session.id()), None)
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (&ClientErrorKind::Problem(ProblemKind::Forbidden), Some(403))
    );
    // And it waits behind the owner's hold: its own acquire times out, typed.
    let theirs = other.open_session(Duration::from_secs(5)).await.unwrap();
    let e = theirs
        .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.is_deadline_exceeded(), "{e:?}");

    // The owner releases over mTLS; the other identity then gets a higher token.
    hold.release().await.unwrap();
    let next = theirs
        .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(next.token().unwrap() > token);
    next.release().await.unwrap();
    theirs.close().await.unwrap();
    session.close().await.unwrap();
    let state = f
        .service
        .locker
        .lock_state(&LockName::new("ns", "c", "k"))
        .await
        .unwrap();
    assert!(
        state.holders.is_empty() && state.waiters.is_empty(),
        "{state:?}"
    );
}

#[tokio::test]
async fn etcd_client_mtls_refusals_are_typed_unauthenticated() {
    let f = fixture().await;
    let ttl = Duration::from_secs(5);
    // A certificate without a SPIFFE ID (none, not SPIFFE, or two): the service's 401.
    for uris in [&[][..], &["https://example.org/x"][..], &[OWNER, OTHER][..]] {
        let e = client_with(&f, uris).open_session(ttl).await.unwrap_err();
        assert_eq!(
            e.kind(),
            &ClientErrorKind::Problem(ProblemKind::Unauthenticated),
            "{uris:?}: {e}"
        );
        assert_eq!(e.status(), Some(401));
        assert!(e.detail().contains("SPIFFE"), "{}", e.detail());
    }
    // No client certificate: the service's 401, every time.
    let bare = Client::new_mtls(
        f.url.clone(),
        ClientTls::from_ca_pem(f.pki.ca_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    for _ in 0..20 {
        let e = bare.open_session(ttl).await.unwrap_err();
        assert_eq!(
            e.kind(),
            &ClientErrorKind::Problem(ProblemKind::Unauthenticated),
            "{e:?}"
        );
        assert_eq!(e.status(), Some(401));
        assert!(e.detail().contains("client certificate"), "{}", e.detail());
    }
    // A certificate from another CA: refused the same way.
    let rogue = Pki::new("rogue CA").client(&[OWNER]);
    let tls = ClientTls::from_ca_pem(f.pki.ca_pem().as_bytes())
        .unwrap()
        .with_identity_pem(rogue.cert_pem.as_bytes(), rogue.key_pem.as_bytes())
        .unwrap();
    let e = Client::new_mtls(f.url.clone(), tls)
        .unwrap()
        .open_session(ttl)
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (
            &ClientErrorKind::Problem(ProblemKind::Unauthenticated),
            None
        ),
        "{e:?}"
    );
    // A service whose certificate the client does not trust: a transport error, and
    // nothing was sent.
    let mine = f.pki.client(&[OWNER]);
    let tls = ClientTls::from_ca_pem(Pki::new("other roots").ca_pem().as_bytes())
        .unwrap()
        .with_identity_pem(mine.cert_pem.as_bytes(), mine.key_pem.as_bytes())
        .unwrap();
    let e = Client::new_mtls(f.url.clone(), tls)
        .unwrap()
        .open_session(ttl)
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (&ClientErrorKind::Transport, None),
        "{e:?}"
    );
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[test]
fn client_tls_settings_errors_are_typed_config() {
    let dir = tempfile::tempdir().unwrap();
    let e = ClientTls::from_ca_pem(b"not a pem").unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
    let missing = dir.path().join("missing.pem");
    let e = ClientTls::from_ca_file(&missing).unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let pki = Pki::new("ca");
    let ca = ClientTls::from_ca_pem(pki.ca_pem().as_bytes()).unwrap();
    let svid = pki.client(&[OWNER]);
    // A certificate without its key, and a key file holding a certificate.
    let e = ca
        .clone()
        .with_identity_pem(svid.cert_pem.as_bytes(), b"")
        .unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
    let e = ca
        .clone()
        .with_identity_pem(svid.cert_pem.as_bytes(), svid.cert_pem.as_bytes())
        .unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
    // URL schemes: mTLS is https://, dev mode is http://.
    let e = Client::new_mtls("http://127.0.0.1:1", ca).unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
    let e = Client::new("https://127.0.0.1:1").unwrap_err();
    assert_eq!(e.kind(), &ClientErrorKind::Config);
}

#[tokio::test]
async fn etcd_client_sessions_opened_in_a_namespace_count_against_its_quota() {
    let f = fixture().await;
    let mut ns = Namespace::new("ns", "t");
    ns.held_lease_quota = 2;
    f.service.locker.config().put_namespace(&ns).await.unwrap();
    let client = client_with(&f, &[OWNER]);
    let ttl = Duration::from_secs(5);
    let first = client.open_session_in("ns", ttl).await.unwrap();
    let second = client.open_session_in("ns", ttl).await.unwrap();
    let e = client.open_session_in("ns", ttl).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (
            &ClientErrorKind::Problem(ProblemKind::QuotaExceeded),
            Some(429)
        ),
        "{e}"
    );
    // A session without a namespace takes no slot of its own.
    let free = client.open_session(ttl).await.unwrap();
    // Closing one frees its slot at once.
    first.close().await.unwrap();
    let third = client.open_session_in("ns", ttl).await.unwrap();
    // A namespace the caller has no grant in: 403, no session.
    let e = client.open_session_in("nope", ttl).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (&ClientErrorKind::Problem(ProblemKind::Forbidden), Some(403)),
        "{e}"
    );
    for s in [second, third, free] {
        s.close().await.unwrap();
    }
}

/// `GET path` over TLS without a client certificate (as a kubelet's probe is): the
/// status and the body.
fn get_without_certificate(f: &Fixture, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(f.pki.ca_pem().as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let addr = f.url.trim_start_matches("https://").to_owned();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(&addr).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    // The server may close without a TLS close_notify: keep what arrived.
    let _ = tls.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[tokio::test]
async fn etcd_probes_answer_over_mtls_without_a_client_certificate() {
    let f = fixture().await;
    let (livez, readyz, api) = tokio::task::spawn_blocking(move || {
        (
            get_without_certificate(&f, "/livez"),
            get_without_certificate(&f, "/readyz"),
            get_without_certificate(&f, "/v1/namespaces"),
        )
    })
    .await
    .unwrap();
    assert_eq!(livez, (200, "ok\n".to_owned()));
    assert_eq!(readyz, (200, "ready\n".to_owned()));
    // The API itself still needs the certificate.
    assert_eq!(api.0, 401, "{api:?}");
}
