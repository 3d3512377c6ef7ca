//! Handlers of the subcommands that talk to etcd or to the lock service.

pub(crate) mod lock;
pub(crate) mod serve;
