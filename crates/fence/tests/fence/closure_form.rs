//! `fenced_transaction` / `FencedTransaction`: `BEGIN` and the raise in one flight, and
//! what a dropped or failed body leaves behind, on a real database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_fence::{fenced_transaction, FenceError, FencedTransaction};
use palisade_testkit::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::common::tok;
use crate::postgres_helper::{fresh_db, mark};

/// A TCP proxy to Postgres that records what the client sends and, while `held`, keeps
/// the server's answers back: what the client sends then is what it sent in one flight,
/// without waiting for any answer.
struct HoldingProxy {
    addr: std::net::SocketAddr,
    held: Arc<AtomicBool>,
    released: Arc<Notify>,
    sent: Arc<Mutex<Vec<u8>>>,
}

impl HoldingProxy {
    async fn start(db: &TestDb) -> HoldingProxy {
        let config = db.config();
        let upstream = match &config.get_hosts()[0] {
            Host::Tcp(host) => format!(
                "{host}:{}",
                config.get_ports().first().copied().unwrap_or(5432)
            ),
            other => panic!("the test database must be reached over TCP, not {other:?}"),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(AtomicBool::new(false));
        let released = Arc::new(Notify::new());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (h, r, s) = (held.clone(), released.clone(), sent.clone());
        tokio::spawn(async move {
            let (client, _) = listener.accept().await.unwrap();
            let server = TcpStream::connect(upstream).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    s.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = sr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                while h.load(Ordering::SeqCst) {
                    r.notified().await;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        HoldingProxy {
            addr,
            held,
            released,
            sent,
        }
    }

    fn hold(&self) {
        self.sent.lock().unwrap().clear();
        self.held.store(true, Ordering::SeqCst);
    }

    fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }

    /// Whether the client has sent `needle` since [`hold`](Self::hold).
    fn has_sent(&self, needle: &str) -> bool {
        let sent = self.sent.lock().unwrap();
        sent.windows(needle.len()).any(|w| w == needle.as_bytes())
    }
}

async fn connect_through(proxy: &HoldingProxy, db: &TestDb) -> Client {
    let direct = db.config();
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .dbname(db.name());
    if let Some(user) = direct.get_user() {
        config.user(user);
    }
    if let Some(password) = direct.get_password() {
        config.password(password);
    }
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn fenced_transaction_sends_begin_and_the_raise_in_one_flight() {
    let (db, direct) = fresh_db().await;
    direct
        .batch_execute("CREATE TABLE t (v bigint)")
        .await
        .unwrap();
    let proxy = HoldingProxy::start(&db).await;
    let mut client = connect_through(&proxy, &db).await;

    proxy.hold();
    let write = tokio::spawn(async move {
        fenced_transaction(&mut client, "r", tok(7), |tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO t VALUES (1)", &[]).await?;
                Ok::<_, FenceError>(())
            })
        })
        .await
    });
    // With every answer held back, the client must still send the raise: it does not
    // wait for BEGIN's answer. (Sent in two flights, the raise would never come.)
    let mut in_one_flight = false;
    for _ in 0..200 {
        if proxy.has_sent("BEGIN") && proxy.has_sent("fence_raise") {
            in_one_flight = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let body_early = proxy.has_sent("INSERT INTO t");
    proxy.release();
    write.await.unwrap().unwrap();
    assert!(
        in_one_flight,
        "the raise was not sent before BEGIN answered: sent {:?}",
        String::from_utf8_lossy(&proxy.sent.lock().unwrap())
    );
    assert!(
        !body_early,
        "the body was sent before the raise's verdict came back"
    );
    assert_eq!(mark(&direct, "r").await, Some(tok(7)));
    let n: i64 = direct
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_stale_token_in_one_flight_runs_no_body_and_leaves_the_connection_usable() {
    let (db, mut client) = fresh_db().await;
    client
        .batch_execute("CREATE TABLE t (v bigint)")
        .await
        .unwrap();
    FencedTransaction::begin(&mut client, "r", tok(9))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let err = fenced_transaction(&mut client, "r", tok(8), move |tx| {
        r.store(true, Ordering::SeqCst);
        Box::pin(async move {
            tx.execute("INSERT INTO t VALUES (1)", &[]).await?;
            Ok::<_, FenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    assert_eq!(err.highest(), Some(tok(9)));
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body ran for a stale token"
    );
    // The transaction is over: the next statement commits on its own, so another
    // connection sees it at once.
    client
        .execute("INSERT INTO t VALUES (2)", &[])
        .await
        .unwrap();
    let rows: Vec<i64> = db
        .connect()
        .await
        .query("SELECT v FROM t", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, vec![2], "the refused raise left a transaction open");
}

#[tokio::test]
async fn a_dropped_body_rolls_back_its_writes_and_the_mark() {
    let (db, mut client) = fresh_db().await;
    client
        .batch_execute("CREATE TABLE t (v bigint)")
        .await
        .unwrap();
    let timed_out = tokio::time::timeout(
        Duration::from_millis(300),
        fenced_transaction(&mut client, "r", tok(5), |tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO t VALUES (1)", &[]).await?;
                tx.execute("SELECT pg_sleep(1)", &[]).await?;
                Ok::<_, FenceError>(())
            })
        }),
    )
    .await;
    assert!(
        timed_out.is_err(),
        "the body should still have been running"
    );
    // The ROLLBACK sent on drop runs after the sleep; this statement after it, on its own.
    client
        .execute("INSERT INTO t VALUES (2)", &[])
        .await
        .unwrap();
    let other = db.connect().await;
    let rows: Vec<i64> = other
        .query("SELECT v FROM t ORDER BY v", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows,
        vec![2],
        "the dropped body's write stayed, or the next one did not commit"
    );
    assert_eq!(
        mark(&other, "r").await,
        None,
        "the dropped transaction's raise stayed"
    );
}
