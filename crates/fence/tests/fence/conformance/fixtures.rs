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
        read_resets(&self.admin, resource, limit as i64)
            .await
            .unwrap()
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

/// A key prefix of its own on the shared Redis; each store has a connection of its own.
pub(crate) struct Redis(palisade_testkit::TestRedis);

impl Redis {
    fn layout(&self) -> palisade_fence::redis::KeyLayout {
        palisade_fence::redis::KeyLayout::new(self.0.prefix()).unwrap()
    }
}

impl Fixture for Redis {
    type Store = palisade_fence::RedisStore;

    async fn up() -> Self {
        Redis(palisade_testkit::TestRedis::create().await)
    }

    async fn store(&self) -> palisade_fence::RedisStore {
        palisade_fence::RedisStore::new(self.0.manager().await).with_layout(self.layout())
    }
}

impl Durable for Redis {
    async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
    ) -> Result<FencingToken, (Refusal, String)> {
        use palisade_fence::redis::RedisFenceErrorKind as Kind;
        self.store()
            .await
            .reset(
                resource,
                to,
                reason,
                &palisade_fence::ResetGuard::LockUnknown,
            )
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    Kind::BadReset => Refusal::BadReset,
                    Kind::NoMark => Refusal::NoMark,
                    _ => Refusal::Other,
                };
                (kind, e.to_string())
            })
    }

    async fn resets(&self, resource: &str, limit: usize) -> Vec<MarkReset> {
        self.store()
            .await
            .resets(resource, limit as i64)
            .await
            .unwrap()
    }

    async fn unreachable() -> palisade_fence::RedisStore {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", closed_port())).unwrap();
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(Some(std::time::Duration::from_secs(1)));
        palisade_fence::RedisStore::new(
            redis::aio::ConnectionManager::new_lazy_with_config(client, config).unwrap(),
        )
    }
}

/// A fresh, migrated MariaDB database; each store has a pool of its own.
pub(crate) struct Mysql(palisade_testkit::TestMysqlDb);

impl Fixture for Mysql {
    type Store = palisade_fence::MysqlStore;

    async fn up() -> Self {
        let db = palisade_testkit::TestMysqlDb::create().await;
        palisade_fence::mysql::migrate(&mut db.connect().await)
            .await
            .unwrap();
        Mysql(db)
    }

    async fn store(&self) -> palisade_fence::MysqlStore {
        palisade_fence::MysqlStore::new(self.0.pool())
    }
}

impl Durable for Mysql {
    async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
    ) -> Result<FencingToken, (Refusal, String)> {
        use palisade_fence::mysql::MysqlFenceErrorKind as Kind;
        palisade_fence::mysql::reset_mark(&mut self.0.connect().await, resource, to, reason)
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    Kind::BadReset => Refusal::BadReset,
                    Kind::NoMark => Refusal::NoMark,
                    _ => Refusal::Other,
                };
                (kind, e.to_string())
            })
    }

    async fn resets(&self, resource: &str, limit: usize) -> Vec<MarkReset> {
        palisade_fence::mysql::read_resets(&mut self.0.connect().await, resource, limit as i64)
            .await
            .unwrap()
    }

    async fn unreachable() -> palisade_fence::MysqlStore {
        palisade_fence::MysqlStore::from_url(&format!(
            "mysql://root@127.0.0.1:{}/fence",
            closed_port()
        ))
        .unwrap()
    }
}
