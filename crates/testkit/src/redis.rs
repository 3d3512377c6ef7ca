//! Redis for one test: a key prefix of its own on the shared server, or a private
//! `redis-server` process.
