//! Handlers of the subcommands that talk to etcd or to the lock service.

pub(crate) mod chaos;
pub(crate) mod lock;
pub(crate) mod serve;
