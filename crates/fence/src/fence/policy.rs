//! What the layer checks: enforcement per resource.

/// How a resource's writes are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Enforcement {
    /// A write without a current token is refused (428, 400 or 409).
    #[default]
    Fenced,
    /// Every write goes through; one without a current token is reported to the
    /// [`WriteObserver`](crate::WriteObserver) as unprotected.
    Advisory,
}

/// Enforcement by resource prefix: the longest matching prefix wins, else the default.
///
/// ```
/// use palisade_fence::{Enforcement, EnforcementTable};
///
/// let table = EnforcementTable::new(Enforcement::Fenced)
///     .with_prefix("/legacy/", Enforcement::Advisory)
///     .with_prefix("/legacy/billing/", Enforcement::Fenced);
/// assert_eq!(table.resolve("/orders/1"), Enforcement::Fenced);
/// assert_eq!(table.resolve("/legacy/report"), Enforcement::Advisory);
/// assert_eq!(table.resolve("/legacy/billing/7"), Enforcement::Fenced);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnforcementTable {
    default: Enforcement,
    /// Sorted by descending prefix length, so the first match is the longest.
    prefixes: Vec<(String, Enforcement)>,
}

impl EnforcementTable {
    /// A table where every resource gets `default`.
    #[must_use]
    pub fn new(default: Enforcement) -> Self {
        EnforcementTable {
            default,
            prefixes: Vec::new(),
        }
    }

    /// Resources starting with `prefix` get `enforcement` (replacing an equal prefix).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>, enforcement: Enforcement) -> Self {
        let prefix = prefix.into();
        self.prefixes.retain(|(p, _)| *p != prefix);
        self.prefixes.push((prefix, enforcement));
        self.prefixes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self
    }

    /// The enforcement of `resource`.
    pub fn resolve(&self, resource: &str) -> Enforcement {
        self.prefixes
            .iter()
            .find(|(p, _)| resource.starts_with(p.as_str()))
            .map_or(self.default, |(_, e)| *e)
    }
}
