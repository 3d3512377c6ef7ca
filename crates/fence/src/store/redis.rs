//! A durable high-water store on Redis.

/// High-water marks kept by the `palisade_fence` Redis Function library.
#[derive(Debug, Clone)]
pub struct RedisStore {}
