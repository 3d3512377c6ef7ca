//! The two workers, driven over stdin and stdout, and the tally of their writes.

use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

use crate::{Error, RESOURCE};

/// A worker process driven over stdin/stdout (one JSON line per answer).
pub(crate) struct Worker {
    pub(crate) name: &'static str,
    pub(crate) pid: u32,
    pub(crate) stdin: ChildStdin,
    pub(crate) events: mpsc::UnboundedReceiver<Value>,
}

impl Worker {
    /// Sends `cmd` and returns its `n` answers (`lost` notices are printed, not counted).
    pub(crate) async fn send(&mut self, cmd: &str, n: usize) -> Result<Vec<Value>, Error> {
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        self.answers(n).await
    }

    pub(crate) async fn answers(&mut self, n: usize) -> Result<Vec<Value>, Error> {
        let mut out = Vec::new();
        while out.len() < n {
            let v = tokio::time::timeout(Duration::from_secs(60), self.events.recv())
                .await
                .map_err(|_| format!("worker {} did not answer in 60 s", self.name))?
                .ok_or_else(|| format!("worker {} exited", self.name))?;
            if v["event"] == "lost" {
                println!(
                    "      worker {}: its hold is lost (the lost signal fired)",
                    self.name.to_uppercase()
                );
            } else if v["event"] == "error" {
                return Err(format!("worker {}: {}", self.name, v["error"]).into());
            } else {
                out.push(v);
            }
        }
        Ok(out)
    }
}

pub(crate) struct Tally {
    pub(crate) admitted: u64,
    pub(crate) rejected: u64,
}

impl Tally {
    pub(crate) fn count(&mut self, who: &str, answers: &[Value]) {
        for a in answers {
            match (
                a["via"].as_str(),
                a["status"].as_u64(),
                a["committed"].as_bool(),
            ) {
                (Some("http"), Some(200), _) => {
                    self.admitted += 1;
                    println!(
                        "      {who} PUT {RESOURCE} with token {} -> 200 admitted",
                        a["token"]
                    );
                }
                (Some("http"), Some(status), _) => {
                    self.rejected += 1;
                    println!("      {who} PUT {RESOURCE} with token {} -> {status} REFUSED by the fence layer", a["token"]);
                }
                (Some("postgres"), _, Some(true)) => {
                    self.admitted += 1;
                    println!(
                        "      {who} fenced_transaction with token {} -> committed",
                        a["token"]
                    );
                }
                (Some("postgres"), _, Some(false)) => {
                    self.rejected += 1;
                    println!(
                        "      {who} fenced_transaction with token {} -> REFUSED by the database (highest {})",
                        a["token"], a["highest"]
                    );
                }
                _ => println!("      {who}: {a}"),
            }
        }
    }
}
