//! Test support for Palisade: the real parts, started by the tests themselves.
//!
//! - [`TestDb`]: a fresh PostgreSQL database per test, dropped afterwards.
//! - [`PgServer`]: a private PostgreSQL server (its own `initdb` cluster on a free port)
//!   that may be stopped, crashed and started again ([`StopMode`]).
//! - [`TestRedis`]: a key prefix of one test's own on the shared Redis
//!   (`PALISADE_REDIS_URL`), its keys deleted afterwards; [`RedisServer`]: a private
//!   `redis-server` in a temp dir on a free port ([`RedisPersistence`]), killed and started
//!   again on demand.
//! - [`PgBouncer`]: a private PgBouncer in transaction pool mode in front of the shared
//!   server, on a free loopback port.
//! - [`EtcdCluster`]: one etcd member or a cluster of several, each a real `etcd` process in
//!   a temp dir on free loopback ports; kill, restart, pause, leader, snapshot and restore.
//!   `PALISADE_ETCD` picks the `etcd` binary (etcd 3.4 and 3.5 both run): [`EtcdBinaries`].
//! - [`TestMysqlDb`]: a fresh MySQL/MariaDB database per test (and accounts made for it),
//!   dropped afterwards.
//! - [`LossyProxy`]: a TCP proxy on loopback that loses a request or its answer on demand.
//! - [`Placement`]: where etcd members and a [`PgServer`] run, for a caller that puts them
//!   on network hosts of its own (an address and a command prefix such as
//!   `ip netns exec NETNS`); loopback by default.
//!
//! Nothing here is mocked and nothing is skipped: a missing server fails the test with a
//! message that names `scripts/test`, which installs and starts what is missing.

mod etcd;
mod mysql;
mod pg_server;
mod pgbouncer;
mod placement;
mod postgres;
mod proxy;
mod redis;

pub use self::redis::{
    redis_url, RedisPersistence, RedisServer, RedisServerError, TestRedis, DEFAULT_REDIS_URL,
    REDIS_URL_VARIABLE,
};
pub use etcd::{
    BumpUnsupported, EtcdBinaries, EtcdCluster, EtcdTlsFiles, EtcdVersion, LocateError,
    MemberStatus, RestoreMode, Snapshot, ETCD_VARIABLE,
};
pub use mysql::{TestMysqlDb, TestMysqlUser};
pub use pg_server::{PgServer, PgServerError, StopMode};
pub use pgbouncer::PgBouncer;
pub use placement::Placement;
pub use postgres::TestDb;
pub use proxy::{Loss, LossyProxy};
