//! A fresh MySQL/MariaDB database for one test.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool};

/// The admin URL when `PALISADE_MYSQL_ADMIN` is not set.
const DEFAULT_ADMIN: &str = "mysql://root@127.0.0.1:3306";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A database created for one test on the server named by `PALISADE_MYSQL_ADMIN` (a
/// `mysql://` URL of an account that may create databases and users; default
/// `mysql://root@127.0.0.1:3306`). It is dropped, with the accounts made by
/// [`create_user`](Self::create_user) and after killing the sessions still using it,
/// when the value is dropped.
#[derive(Debug)]
pub struct TestMysqlDb {
    name: String,
    admin: Opts,
    users: Mutex<Vec<String>>,
}

/// An account made by [`TestMysqlDb::create_user`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestMysqlUser {
    /// The user name (unique on the server).
    pub name: String,
    /// Its password.
    pub password: String,
    /// A URL that logs in as it, on the test database.
    pub url: String,
}

impl TestMysqlDb {
    /// Creates a database with a unique name (`palisade_test_<pid>_<time>_<n>`).
    ///
    /// # Panics
    ///
    /// If the server does not answer or refuses: the message names `scripts/test`.
    pub async fn create() -> TestMysqlDb {
        let admin = admin_opts();
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
        let mut conn = connect_admin(&admin).await;
        conn.query_drop(format!("CREATE DATABASE `{name}`"))
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        let _ = conn.disconnect().await;
        TestMysqlDb {
            name,
            admin,
            users: Mutex::new(Vec::new()),
        }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection settings for this database, as the admin account.
    pub fn opts(&self) -> Opts {
        OptsBuilder::from_opts(self.admin.clone())
            .db_name(Some(self.name.clone()))
            .into()
    }

    /// A URL for this database, as the admin account.
    pub fn url(&self) -> String {
        url_of(&self.admin, None, &self.name)
    }

    /// The server's host and port.
    pub fn host_port(&self) -> (String, u16) {
        (
            self.admin.ip_or_hostname().to_owned(),
            self.admin.tcp_port(),
        )
    }

    /// Opens a new connection to this database as the admin account.
    ///
    /// # Panics
    ///
    /// If the connection fails.
    pub async fn connect(&self) -> Conn {
        Conn::new(self.opts())
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {}: {e}", self.name))
    }

    /// A pool of connections to this database as the admin account.
    pub fn pool(&self) -> Pool {
        Pool::new(self.opts())
    }

    /// Creates an account (`'<name>'@'%'`, unique on the server, dropped with the
    /// database), runs each of `grants` for it (`{db}` stands for this database, `{user}`
    /// for the account: `"GRANT EXECUTE ON PROCEDURE {db}.fence_raise TO {user}"`), and
    /// returns its name, password and URL.
    ///
    /// # Panics
    ///
    /// If the server refuses a statement.
    pub async fn create_user(&self, grants: &[&str]) -> TestMysqlUser {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("pt_{}_{n}", std::process::id());
        let password = format!("pw{n}x");
        let account = format!("'{name}'@'%'");
        let mut conn = connect_admin(&self.admin).await;
        conn.query_drop(format!("CREATE USER {account} IDENTIFIED BY '{password}'"))
            .await
            .unwrap_or_else(|e| panic!("creating test account {account}: {e}"));
        self.users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(account.clone());
        for grant in grants {
            let sql = grant
                .replace("{db}", &format!("`{}`", self.name))
                .replace("{user}", &account);
            conn.query_drop(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let _ = conn.disconnect().await;
        let url = url_of(&self.admin, Some((&name, &password)), &self.name);
        TestMysqlUser {
            name,
            password,
            url,
        }
    }
}

impl Drop for TestMysqlDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        let users = std::mem::take(&mut *self.users.lock().unwrap_or_else(|e| e.into_inner()));
        // Drop runs inside or outside a runtime; a thread of its own works in both.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = Conn::new(admin).await.ok()?;
                // Sessions still in the database (a pool not yet closed, a transaction
                // left open) would hold metadata locks that DROP DATABASE waits on.
                let ids: Vec<u64> = conn
                    .exec(
                        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
                        (name.as_str(),),
                    )
                    .await
                    .ok()?;
                for id in ids {
                    let _ = conn.query_drop(format!("KILL {id}")).await;
                }
                for user in &users {
                    let _ = conn.query_drop(format!("DROP USER IF EXISTS {user}")).await;
                }
                conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
                    .await
                    .ok()?;
                let _ = conn.disconnect().await;
                Some(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}

fn admin_opts() -> Opts {
    let url = std::env::var("PALISADE_MYSQL_ADMIN").unwrap_or_else(|_| DEFAULT_ADMIN.to_owned());
    Opts::from_url(&url)
        .unwrap_or_else(|e| panic!("PALISADE_MYSQL_ADMIN={url:?} is not a mysql:// URL: {e}"))
}

async fn connect_admin(admin: &Opts) -> Conn {
    match Conn::new(admin.clone()).await {
        Ok(conn) => conn,
        Err(e) => panic!(
            "MySQL/MariaDB is not reachable at {}:{} (PALISADE_MYSQL_ADMIN, default {DEFAULT_ADMIN}): {e}\n\
             run scripts/test, which installs and starts MariaDB on 127.0.0.1:3306",
            admin.ip_or_hostname(),
            admin.tcp_port()
        ),
    }
}

/// A `mysql://` URL for `db` on the admin's server, as `login` or the admin's account.
fn url_of(admin: &Opts, login: Option<(&str, &str)>, db: &str) -> String {
    let auth = match login {
        Some((user, password)) => format!("{user}:{password}@"),
        None => match (admin.user(), admin.pass()) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            (Some(u), None) => format!("{u}@"),
            _ => String::new(),
        },
    };
    format!(
        "mysql://{auth}{}:{}/{db}",
        admin.ip_or_hostname(),
        admin.tcp_port()
    )
}
