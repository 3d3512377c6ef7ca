//! A fresh PostgreSQL database for one test.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio_postgres::{Client, Config, NoTls};

/// The admin connection string when `PALISADE_PG_ADMIN` is not set.
const DEFAULT_ADMIN: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A database created for one test on the server named by `PALISADE_PG_ADMIN`
/// (a libpq key/value or URL connection string; default
/// `host=127.0.0.1 port=5432 user=postgres`). It is dropped, with any open connections,
/// when the value is dropped.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    admin: String,
    config: Config,
}

impl TestDb {
    /// Creates a database with a unique name (`palisade_test_<pid>_<time>_<n>`).
    ///
    /// # Panics
    ///
    /// If the server does not answer or refuses: the message names `scripts/test`.
    pub async fn create() -> TestDb {
        let admin = std::env::var("PALISADE_PG_ADMIN").unwrap_or_else(|_| DEFAULT_ADMIN.to_owned());
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "palisade_test_{}_{}_{}",
            std::process::id(),
            nanos,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let client = connect_admin(&admin).await;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        let mut config: Config = admin
            .parse()
            .expect("PALISADE_PG_ADMIN is a valid connection string");
        config.dbname(&name);
        TestDb {
            name,
            admin,
            config,
        }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection settings for this database.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A connection string for this database (libpq key/value form).
    pub fn connection_string(&self) -> String {
        format!("{} dbname={}", strip_dbname(&self.admin), self.name)
    }

    /// Opens a new connection, driving it on a spawned task.
    ///
    /// # Panics
    ///
    /// If the connection fails.
    pub async fn connect(&self) -> Client {
        let (client, connection) = self
            .config
            .connect(NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {}: {e}", self.name));
        tokio::spawn(connection);
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside or outside a runtime; a thread of its own works in both.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let (client, connection) = tokio_postgres::connect(&admin, NoTls).await.ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}

async fn connect_admin(admin: &str) -> Client {
    match tokio_postgres::connect(admin, NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            client
        }
        Err(e) => panic!(
            "PostgreSQL is not reachable with PALISADE_PG_ADMIN={admin:?}: {e}\n\
             run scripts/test, which installs and starts PostgreSQL on 127.0.0.1:5432"
        ),
    }
}

fn strip_dbname(conn: &str) -> String {
    conn.split_whitespace()
        .filter(|kv| !kv.starts_with("dbname="))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_database_is_fresh_and_dropped_afterwards() {
        let a = TestDb::create().await;
        let b = TestDb::create().await;
        assert_ne!(a.name(), b.name());
        let client = a.connect().await;
        client
            .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
            .await
            .unwrap();
        let other = b.connect().await;
        let err = other.query("SELECT x FROM t", &[]).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
        );
        let name = a.name().to_owned();
        drop(client);
        drop(a);
        let admin = connect_admin(DEFAULT_ADMIN).await;
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "database {name} should have been dropped");
    }
}
