//! A durable high-water store on MySQL/MariaDB.

/// High-water marks in MariaDB's `fence_high_water` table.
#[derive(Debug, Clone)]
pub struct MysqlStore {}
