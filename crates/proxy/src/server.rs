//! Running the proxy: the store, the audit sink, the listeners, reloads and the drain.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::routing::get;
use http::StatusCode;
use palisade_audit::AuditSink;
use palisade_fence::{
    HighWaterStore, MemoryStore, MysqlStore, PostgresStore, RedisStore, WriteObserver,
};
use palisade_listen::{ConnLimits, Transport};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{ProxyConfig, StoreConfig};
use crate::metrics::ProxyMetrics;
use crate::service::{ProxyService, Reporter, Routing};

/// Connections to the Postgres store, per replica.
const STORE_POOL: usize = 16;
/// How long `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the proxy cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A listen address cannot be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// `listen` or `admin`.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The store's or the audit trail's database pool cannot be built.
    #[error("{what}: {source}")]
    Database {
        /// `store.database` or `audit.database`.
        what: &'static str,
        /// Why.
        source: palisade_audit::AuditError,
    },
    /// `store.url` (or `store.prefix`) does not name a store the client can use.
    #[error("store: {cause}")]
    StoreUrl {
        /// Why, with the client's own message.
        cause: String,
    },
}

/// Why a reload was refused; the running config keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: changing it needs a restart; the running config keeps serving")]
pub struct ReloadError {
    /// The field that differs.
    pub field: &'static str,
}

enum Readiness {
    Memory,
    Postgres(deadpool_postgres::Pool),
    Redis(redis::aio::ConnectionManager),
    Mysql(mysql_async::Pool),
}

/// Swaps the routes of a running proxy.
#[derive(Clone)]
pub struct Reloader {
    shared: Arc<Shared>,
}

struct Shared {
    running: ArcSwap<ProxyConfig>,
    routing: Arc<ArcSwap<Routing>>,
    store: Arc<dyn HighWaterStore>,
    metrics: ProxyMetrics,
    report: Option<Reporter>,
}

impl Reloader {
    /// Serves `config` from the next request on: its routes, upstream and upstream
    /// timeouts. Requests in flight finish under the config they started with.
    ///
    /// # Errors
    ///
    /// [`ReloadError`] when a field that needs a restart differs (`listen`, `admin`,
    /// `store`, `audit`, `http2`, `max_connections`, `timeouts.header_ms`,
    /// `timeouts.body_stall_ms`, `timeouts.drain_ms`); nothing changes then.
    pub fn reload(&self, config: ProxyConfig) -> Result<(), ReloadError> {
        let running = self.shared.running.load();
        let fixed: [(&'static str, bool); 9] = [
            ("listen", running.listen != config.listen),
            ("admin", running.admin != config.admin),
            ("store", running.store != config.store),
            ("audit", running.audit != config.audit),
            ("http2", running.http2 != config.http2),
            (
                "max_connections",
                running.max_connections != config.max_connections,
            ),
            (
                "timeouts.header_ms",
                running.timeouts.header != config.timeouts.header,
            ),
            (
                "timeouts.body_stall_ms",
                running.timeouts.body_stall != config.timeouts.body_stall,
            ),
            (
                "timeouts.drain_ms",
                running.timeouts.drain != config.timeouts.drain,
            ),
        ];
        if let Some((field, _)) = fixed.iter().find(|(_, differs)| *differs) {
            return Err(ReloadError { field });
        }
        let shared = &self.shared;
        let routing = Routing::of(
            &config,
            &shared.store,
            &shared.metrics,
            shared.report.as_ref(),
        );
        shared.routing.store(Arc::new(routing));
        shared.running.store(Arc::new(config));
        Ok(())
    }
}

/// A proxy with its listeners bound; [`run`](Proxy::run) serves it.
pub struct Proxy {
    shared: Arc<Shared>,
    listener: TcpListener,
    admin: Option<TcpListener>,
    readiness: Arc<Readiness>,
    sink: Option<AuditSink>,
}

impl Proxy {
    /// Builds the store and the audit sink (databases may be down: `/readyz` says so,
    /// and audit rows spool) and binds the listeners.
    ///
    /// # Errors
    ///
    /// [`ProxyError`]: an address cannot be bound, a pool cannot be built.
    pub async fn bind(config: ProxyConfig) -> Result<Proxy, ProxyError> {
        let (store, readiness): (Arc<dyn HighWaterStore>, Readiness) = match &config.store {
            StoreConfig::Memory { capacity } => {
                (Arc::new(MemoryStore::new(*capacity)), Readiness::Memory)
            }
            StoreConfig::Postgres { database } => {
                let pool = palisade_audit::pool(database, STORE_POOL).map_err(|source| {
                    ProxyError::Database {
                        what: "store.database",
                        source,
                    }
                })?;
                (
                    Arc::new(PostgresStore::from_pool(pool.clone())),
                    Readiness::Postgres(pool),
                )
            }
            StoreConfig::Redis { url, prefix } => {
                // Lazy: a Redis that is down at start makes /readyz say so, and raises
                // fail closed (503) until it answers.
                let client =
                    redis::Client::open(url.as_str()).map_err(|e| ProxyError::StoreUrl {
                        cause: e.to_string(),
                    })?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_number_of_retries(RedisStore::RECONNECT_ATTEMPTS)
                    .set_connection_timeout(Some(RedisStore::CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RedisStore::RESPONSE_TIMEOUT));
                let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| ProxyError::StoreUrl {
                        cause: e.to_string(),
                    })?;
                let mut store = RedisStore::new(conn.clone());
                if let Some(prefix) = prefix {
                    let layout =
                        palisade_fence::redis::KeyLayout::new(prefix.as_str()).map_err(|e| {
                            ProxyError::StoreUrl {
                                cause: e.to_string(),
                            }
                        })?;
                    store = store.with_layout(layout);
                }
                (Arc::new(store), Readiness::Redis(conn))
            }
            StoreConfig::Mysql { url } => {
                let store =
                    MysqlStore::from_url(&mysql_url(url)).map_err(|e| ProxyError::StoreUrl {
                        cause: e.to_string(),
                    })?;
                let pool = store.pool().clone();
                (Arc::new(store), Readiness::Mysql(pool))
            }
        };
        let sink = match &config.audit {
            None => None,
            Some(audit) => {
                let pool = palisade_audit::pool(&audit.database, 2).map_err(|source| {
                    ProxyError::Database {
                        what: "audit.database",
                        source,
                    }
                })?;
                Some(AuditSink::builder(audit.service.clone(), audit.spool.clone()).start(pool))
            }
        };
        let report: Option<Reporter> = sink.as_ref().map(|s| {
            let observer = s.observer();
            Arc::new(move |event| observer.observe(event)) as Reporter
        });
        let metrics = ProxyMetrics::new();
        let routing = Routing::of(&config, &store, &metrics, report.as_ref());
        let listener = bind(config.listen, "listen").await?;
        let admin = match config.admin {
            Some(addr) => Some(bind(addr, "admin").await?),
            None => None,
        };
        Ok(Proxy {
            shared: Arc::new(Shared {
                running: ArcSwap::from_pointee(config),
                routing: Arc::new(ArcSwap::from_pointee(routing)),
                store,
                metrics,
                report,
            }),
            listener,
            admin,
            readiness: Arc::new(readiness),
            sink,
        })
    }

    /// The address clients connect to.
    ///
    /// # Panics
    ///
    /// Never for a bound listener.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The admin listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The proxy's metrics.
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// A handle that swaps the running config.
    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until `shutdown` completes, then drains: no new connection, requests in
    /// flight answered within `timeouts.drain_ms` (then dropped), audit events flushed.
    /// Returns how many connections were still open when the drain ran out (0 when every
    /// request finished).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> bool {
        let running = self.shared.running.load_full();
        let timeouts = running.timeouts;
        let mut limits = ConnLimits::new()
            .with_header_timeout(timeouts.header)
            .with_body_stall_timeout(timeouts.body_stall)
            .with_max_connections(running.max_connections)
            .with_probe_reserve(0);
        if running.http2 {
            limits = limits.with_http2();
        }
        let (stop, stopping) = watch::channel(false);
        let service = ProxyService {
            routing: Arc::clone(&self.shared.routing),
            metrics: self.shared.metrics.clone(),
        };
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let main = palisade_listen::serve(
            self.listener,
            Transport::Plain,
            limits,
            move |_| service.clone(),
            stopped(stopping.clone()),
        );
        let admin = self.admin.map(|listener| {
            let app = admin_app(
                Arc::clone(&self.readiness),
                self.shared.metrics.clone(),
                self.sink.as_ref().map(AuditSink::observer),
            );
            let limits = ConnLimits::new()
                .with_header_timeout(timeouts.header)
                .with_max_connections(64)
                .with_probe_reserve(0);
            tokio::spawn(palisade_listen::serve(
                listener,
                Transport::Plain,
                limits,
                move |_| app.clone(),
                stopped(stopping.clone()),
            ))
        });
        tokio::pin!(main);
        tokio::select! {
            () = &mut main => {}
            () = shutdown => {
                tracing::info!(drain_ms = timeouts.drain.as_millis() as u64, "stopping: draining requests in flight");
                let _ = stop.send(true);
            }
        }
        let drained = tokio::time::timeout(timeouts.drain, &mut main)
            .await
            .is_ok();
        if !drained {
            tracing::warn!("requests still in flight after the drain time; dropping them");
        }
        if let Some(admin) = admin {
            admin.abort();
        }
        if let Some(sink) = self.sink {
            let stats = sink.shutdown().await;
            tracing::info!(?stats, "audit events flushed");
        }
        drained
    }
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, ProxyError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ProxyError::Bind { addr, what, source })
}

fn admin_app(
    readiness: Arc<Readiness>,
    metrics: ProxyMetrics,
    audit: Option<palisade_audit::SinkObserver>,
) -> axum::Router {
    axum::Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = Arc::clone(&readiness);
                async move { ready(&readiness).await }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                if let Some(audit) = &audit {
                    metrics.set_audit_dropped(audit.dropped());
                }
                let text = metrics.render();
                async move {
                    (
                        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        text,
                    )
                }
            }),
        )
}

/// A store's readiness check: `Err` says why it does not answer.
type Check<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// 200 when the store answers, 503 naming why otherwise.
async fn ready(readiness: &Readiness) -> (StatusCode, String) {
    let (kind, check): (&str, Check<'_>) = match readiness {
        Readiness::Memory => return (StatusCode::OK, "ready: memory store\n".into()),
        Readiness::Postgres(pool) => (
            "postgres",
            Box::pin(async {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            }),
        ),
        // The fence library answers as this build's own (loaded if missing), not only the
        // server: a server without it refuses every fenced write.
        Readiness::Redis(conn) => (
            "redis",
            Box::pin(async {
                palisade_fence::redis::RedisFence::load(&mut conn.clone())
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        ),
        // The database answers and holds the fence's raise procedure, which this account
        // can see (it needs EXECUTE on it).
        Readiness::Mysql(pool) => (
            "mysql",
            Box::pin(async {
                use mysql_async::prelude::Queryable;
                let mut conn = pool.get_conn().await.map_err(|e| e.to_string())?;
                let found: Option<i64> = conn
                    .query_first(
                        "SELECT COUNT(*) FROM information_schema.ROUTINES \
                         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = 'fence_raise' \
                         AND ROUTINE_TYPE = 'PROCEDURE'",
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                match found {
                    Some(1) => Ok(()),
                    _ => Err(
                        "it has no fence_raise procedure this account may run (install \
                              the fence with palisade_fence::mysql::migrate, and grant EXECUTE)"
                            .to_owned(),
                    ),
                }
            }),
        ),
    };
    match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(())) => (StatusCode::OK, format!("ready: {kind} store answers\n")),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: the {kind} store does not answer: {e}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the {kind} store did not answer within {} ms\n",
                READY_TIMEOUT.as_millis()
            ),
        ),
    }
}

/// mysql_async reads only the `mysql://` scheme; `mariadb://` names the same thing.
fn mysql_url(url: &str) -> String {
    match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    }
}
