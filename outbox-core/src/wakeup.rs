//! In-process wake-up after a commit that wrote outbox rows.
//!
//! The write path calls [`notify_committed`] after every successful commit that
//! inserted events ([`AfterCommit::committed`](crate::AfterCommit::committed));
//! a relay in the same process holds a [`CommitListener`] and
//! publishes at once instead of waiting for its next poll. Wake-ups are never
//! lost (a commit between two waits is seen by the next wait) and never
//! required for correctness: the relay still polls.

use std::sync::LazyLock;

use tokio::sync::watch;

static COMMITS: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

/// Signals that a transaction which wrote outbox rows has committed.
pub fn notify_committed() {
    COMMITS.send_modify(|generation| *generation = generation.wrapping_add(1));
}

/// Creates a listener that is woken by every [`notify_committed`] after its creation.
pub fn listener() -> CommitListener {
    CommitListener {
        receiver: COMMITS.subscribe(),
    }
}

/// Awaits commits signalled with [`notify_committed`].
#[derive(Debug, Clone)]
pub struct CommitListener {
    receiver: watch::Receiver<u64>,
}

impl CommitListener {
    /// Returns when at least one commit was signalled since the previous call
    /// (or since the listener was created).
    pub async fn committed(&mut self) {
        // The sender is a static and never dropped, so `changed` cannot fail.
        let _ = self.receiver.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_since_the_last_wait_returns_at_once() {
        let mut listener = listener();
        notify_committed();
        listener.committed().await;
    }
}
