//! Handlers of the subcommands that talk to etcd or to the lock service, one module per
//! command group; `connect` (the connection flags), `listen` (a listener's bounds), `etcd` (the etcd clusters and TLS to them), `exit` (the exit codes), `args` (shared
//! value parsers) and `output` (stdout and stderr without panics) are shared.

pub(crate) mod args;
pub(crate) mod chaos;
pub(crate) mod config;
pub(crate) mod connect;
pub(crate) mod epoch;
pub(crate) mod etcd;
pub(crate) mod exit;
pub(crate) mod fence;
pub(crate) mod force;
pub(crate) mod listen;
pub(crate) mod lock;
pub(crate) mod mark_store;
pub(crate) mod output;
pub(crate) mod proxy;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod session;
