//! [`HolderMeta`]: a small JSON object a holder attaches to its hold.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::InvalidInput;

/// The largest [`HolderMeta`], in bytes of its compact JSON serialization.
///
/// It is stored in the value of the waiter, hold and grant-record keys of the hold (three
/// copies per hold, written in the grant Txn), so it is kept small: etcd's cost grows with
/// value size, and a status read returns it for every holder.
pub const MAX_HOLDER_META_LEN: usize = 1024;

/// A JSON object the holder attaches to a hold (host, pid, job id...), at most
/// [`MAX_HOLDER_META_LEN`] bytes as compact JSON. Stored with the hold in etcd and
/// returned for each holder by the lock core's lock state and the service's status
/// route. Palisade never interprets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Map<String, Value>", into = "Map<String, Value>")]
pub struct HolderMeta(Map<String, Value>);

impl HolderMeta {
    /// Checks the size.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::HolderMetaTooLarge`] over [`MAX_HOLDER_META_LEN`] bytes.
    pub fn new(object: Map<String, Value>) -> Result<Self, InvalidInput> {
        let len = serde_json::to_vec(&object).map_or(usize::MAX, |v| v.len());
        if len > MAX_HOLDER_META_LEN {
            return Err(InvalidInput::HolderMetaTooLarge { len });
        }
        Ok(HolderMeta(object))
    }

    /// Any JSON value: only an object is accepted.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::HolderMetaNotObject`]; [`InvalidInput::HolderMetaTooLarge`].
    pub fn from_value(value: Value) -> Result<Self, InvalidInput> {
        match value {
            Value::Object(o) => HolderMeta::new(o),
            _ => Err(InvalidInput::HolderMetaNotObject),
        }
    }

    /// The object.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }
}

impl TryFrom<Map<String, Value>> for HolderMeta {
    type Error = InvalidInput;

    fn try_from(object: Map<String, Value>) -> Result<Self, InvalidInput> {
        HolderMeta::new(object)
    }
}

impl From<HolderMeta> for Map<String, Value> {
    fn from(meta: HolderMeta) -> Self {
        meta.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn holder_meta_is_an_object_of_bounded_size() {
        let ok = HolderMeta::from_value(json!({"host": "a", "pid": 7})).unwrap();
        assert_eq!(ok.as_map()["pid"], 7);
        // Exactly at the limit: {"k":"<s>"} is 8 bytes of syntax plus the string.
        let at = json!({ "k": "x".repeat(MAX_HOLDER_META_LEN - 8) });
        assert_eq!(serde_json::to_vec(&at).unwrap().len(), MAX_HOLDER_META_LEN);
        assert!(HolderMeta::from_value(at).is_ok());
        let over = json!({ "k": "x".repeat(MAX_HOLDER_META_LEN - 7) });
        let e = HolderMeta::from_value(over).unwrap_err();
        assert_eq!(
            e,
            InvalidInput::HolderMetaTooLarge {
                len: MAX_HOLDER_META_LEN + 1
            }
        );
        for v in [json!([1]), json!("s"), json!(1), json!(null)] {
            assert_eq!(
                HolderMeta::from_value(v).unwrap_err(),
                InvalidInput::HolderMetaNotObject
            );
        }
        // Deserializing checks the size too.
        let big = format!(r#"{{"k":"{}"}}"#, "x".repeat(2000));
        assert!(serde_json::from_str::<HolderMeta>(&big).is_err());
        assert!(serde_json::from_str::<HolderMeta>("[1]").is_err());
    }
}
