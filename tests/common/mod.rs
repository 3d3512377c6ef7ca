//! Support shared by the integration tests of the `palisade` package.

#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod pki;
pub mod service;
