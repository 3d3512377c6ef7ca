//! [`LockName`]: which lock, by namespace, class and key.

/// Names one lock: a key in a class of a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockName {
    /// Namespace.
    pub ns: String,
    /// Class within the namespace.
    pub class: String,
    /// Lock key; must start with the class's key prefix.
    pub key: String,
}

impl LockName {
    /// Names a lock.
    pub fn new(ns: impl Into<String>, class: impl Into<String>, key: impl Into<String>) -> Self {
        LockName {
            ns: ns.into(),
            class: class.into(),
            key: key.into(),
        }
    }
}
