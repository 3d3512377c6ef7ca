//! The epoch rows of a watch response: epoch records and rehome switches (see the
//! [tailer's docs](super)).

use palisade_api::keys::RootKeys;
use palisade_api::{EpochRecord, RehomeRecord};
use palisade_fence::Revision;

use super::Change;
use crate::{ClusterId, EpochAdvance, RehomeSwitch};

/// The epoch records and rehome switches among a response's changes outside the lock
/// key space (every other key yields nothing).
#[derive(Debug, Default)]
pub(crate) struct EpochChanges {
    pub(crate) advances: Vec<EpochAdvance>,
    pub(crate) switches: Vec<RehomeSwitch>,
}

impl EpochChanges {
    pub(crate) fn of(cluster: ClusterId, keys: &RootKeys, changes: &[Change]) -> Self {
        let epoch_key = keys.epoch();
        let rehome_prefix = keys.rehome("");
        let mut out = EpochChanges::default();
        for c in changes.iter().filter(|c| !c.delete) {
            let Ok(rev) = Revision::from_i64(c.revision) else {
                continue;
            };
            if c.key == epoch_key.as_bytes() {
                match serde_json::from_slice::<EpochRecord>(&c.value) {
                    Ok(record) => out.advances.push(EpochAdvance::new(cluster, rev, record)),
                    Err(e) => {
                        tracing::warn!(%cluster, revision = c.revision, error = %e, "an epoch record the audit cannot read");
                    }
                }
            } else if c.key.starts_with(rehome_prefix.as_bytes()) {
                if let Some(s) = serde_json::from_slice::<RehomeRecord>(&c.value)
                    .ok()
                    .and_then(|r| RehomeSwitch::from_record(cluster, rev, r))
                {
                    out.switches.push(s);
                }
            }
        }
        out
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.advances.is_empty() && self.switches.is_empty()
    }
}
