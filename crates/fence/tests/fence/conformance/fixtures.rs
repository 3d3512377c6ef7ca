//! The stores under the conformance suite, one fixture each.

use palisade_fence::postgres::{read_resets, reset_mark};
use palisade_fence::{FenceErrorKind, FencingToken, MarkReset, MemoryStore, PostgresStore};
use palisade_testkit::TestDb;

use super::{Durable, Fixture, Refusal};
use crate::common::pool;
use crate::postgres_helper::fresh_db;

/// A loopback port that nothing listens on (bound, then released).
pub(crate) fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One [`MemoryStore`], shared by every call of `store`.
pub(crate) struct Memory(MemoryStore);

impl Fixture for Memory {
    type Store = MemoryStore;

    async fn up() -> Self {
        Memory(MemoryStore::new(10_000))
    }

    async fn store(&self) -> MemoryStore {
        self.0.clone()
    }
}

/// A fresh, migrated database; each store has a pool of its own.
pub(crate) struct Postgres {
    db: TestDb,
    admin: tokio_postgres::Client,
}

impl Fixture for Postgres {
    type Store = PostgresStore;

    async fn up() -> Self {
        let (db, admin) = fresh_db().await;
        Postgres { db, admin }
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::from_pool(pool(self.db.config(), 4))
    }
}

impl Durable for Postgres {
    async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
    ) -> Result<FencingToken, (Refusal, String)> {
        reset_mark(&self.admin, resource, to, reason)
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    FenceErrorKind::BadReset => Refusal::BadReset,
                    FenceErrorKind::NoMark => Refusal::NoMark,
                    _ => Refusal::Other,
                };
                (kind, e.to_string())
            })
    }

    async fn resets(&self, resource: &str, limit: usize) -> Vec<MarkReset> {
        read_resets(&self.admin, resource, limit as i64).await.unwrap()
    }

    async fn unreachable() -> PostgresStore {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(closed_port())
            .user("postgres")
            .connect_timeout(std::time::Duration::from_secs(2));
        PostgresStore::from_pool(pool(config, 2))
    }
}
