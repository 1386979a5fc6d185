//! In-process wake-up after a commit that wrote outbox rows.
//!
//! The write path calls [`notify_committed_in`] after every successful commit
//! that inserted events ([`AfterCommit::committed`](crate::AfterCommit::committed));
//! a relay in the same process holds a [`CommitListener`] and
//! publishes at once instead of waiting for its next poll. Wake-ups are never
//! lost (a commit between two waits is seen by the next wait) and never
//! required for correctness: the relay still polls.
//!
//! A commit names the database it went to when the writer knows it (a
//! [`Scope`], from the pool's database name), and a relay listens to its own
//! database's commits only, so that a process with several services, each
//! with a database of its own, does not wake every relay on every commit.
//! A commit without a scope (a writer given a bare connection) wakes every
//! relay, and a relay without one wakes on every commit. The name alone is
//! the key, not the host or port: a writer going through a pooler and a
//! relay connecting directly still meet; two databases of one name on two
//! servers only wake each other needlessly.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{LazyLock, PoisonError, RwLock};

use tokio::sync::watch;

/// The database a commit went to, as the wake-up keys it (a hash of the
/// database's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope(u64);

impl Scope {
    /// The scope of the database called `name`.
    pub fn named(name: &str) -> Self {
        let mut hasher = DefaultHasher::new();
        name.hash(&mut hasher);
        Self(hasher.finish())
    }

    /// The scope of the database a pool with these settings connects to;
    /// `None` if they name none (PostgreSQL then takes the user's name,
    /// which the wake-up does not guess).
    pub fn of_database(name: Option<&str>) -> Option<Self> {
        name.map(Self::named)
    }
}

struct Channels {
    /// Bumped by every commit: what a relay without a scope listens to.
    any: watch::Sender<u64>,
    /// Bumped by commits without a scope: every scoped relay listens to it too.
    unscoped: watch::Sender<u64>,
    /// One channel per scope a relay listens to.
    scoped: RwLock<HashMap<Scope, watch::Sender<u64>>>,
}

static CHANNELS: LazyLock<Channels> = LazyLock::new(|| Channels {
    any: watch::Sender::new(0),
    unscoped: watch::Sender::new(0),
    scoped: RwLock::new(HashMap::new()),
});

fn bump(sender: &watch::Sender<u64>) {
    sender.send_modify(|generation| *generation = generation.wrapping_add(1));
}

/// Signals that a transaction which wrote outbox rows has committed, to a
/// database unknown here: wakes every relay of the process.
pub fn notify_committed() {
    notify_committed_in(None);
}

/// Signals that a transaction which wrote outbox rows has committed to the
/// database of `scope` (unknown if `None`): wakes the relays of that
/// database, and those that listen without a scope.
pub fn notify_committed_in(scope: Option<Scope>) {
    let channels = &*CHANNELS;
    bump(&channels.any);
    match scope {
        None => bump(&channels.unscoped),
        Some(scope) => {
            let scoped = channels
                .scoped
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            // No channel: no relay of this database listens in this process.
            if let Some(sender) = scoped.get(&scope) {
                bump(sender);
            }
        }
    }
}

/// Creates a listener that is woken by every commit signalled after its
/// creation, whatever its database.
pub fn listener() -> CommitListener {
    listener_in(None)
}

/// Creates a listener that is woken by the commits signalled after its
/// creation to the database of `scope` or to an unknown one; with `None`,
/// by every commit.
pub fn listener_in(scope: Option<Scope>) -> CommitListener {
    let channels = &*CHANNELS;
    match scope {
        None => CommitListener {
            first: channels.any.subscribe(),
            second: None,
        },
        Some(scope) => {
            let mut scoped = channels
                .scoped
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let own = scoped
                .entry(scope)
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe();
            CommitListener {
                first: own,
                second: Some(channels.unscoped.subscribe()),
            }
        }
    }
}

/// Awaits commits signalled with [`notify_committed_in`].
#[derive(Debug, Clone)]
pub struct CommitListener {
    first: watch::Receiver<u64>,
    second: Option<watch::Receiver<u64>>,
}

impl CommitListener {
    /// Returns when at least one commit it listens to was signalled since
    /// the previous call (or since the listener was created).
    pub async fn committed(&mut self) {
        // The senders are never dropped (a static holds them), so `changed`
        // cannot fail.
        match &mut self.second {
            None => {
                let _ = self.first.changed().await;
            }
            Some(second) => {
                tokio::select! {
                    _ = self.first.changed() => {}
                    _ = second.changed() => {}
                }
            }
        }
    }

    /// Whether a commit it listens to was signalled since the previous wait,
    /// without waiting and without taking it: the next
    /// [`committed`](Self::committed) returns at once if so.
    pub fn is_pending(&self) -> bool {
        // As in `committed`, the senders live forever: no error to see.
        self.first.has_changed().unwrap_or(false)
            || self
                .second
                .as_ref()
                .is_some_and(|second| second.has_changed().unwrap_or(false))
    }

    /// Takes a signalled commit without waiting: `true` if one was
    /// signalled since the previous wait (which the next
    /// [`committed`](Self::committed) then no longer sees).
    pub fn take_pending(&mut self) -> bool {
        let pending = self.is_pending();
        if pending {
            self.first.mark_unchanged();
            if let Some(second) = &mut self.second {
                second.mark_unchanged();
            }
        }
        pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn woken(listener: &mut CommitListener) -> bool {
        tokio::time::timeout(Duration::from_millis(50), listener.committed())
            .await
            .is_ok()
    }

    // One test: a commit without a scope wakes every listener of the
    // process, so tests running beside each other would see each other's.
    #[tokio::test]
    async fn a_relay_wakes_for_its_own_database_and_for_unknown_ones_only() {
        let orders = Scope::named("wakeup_test_orders");
        let payments = Scope::named("wakeup_test_payments");

        // Before any listener of its database: not kept for a later one.
        notify_committed_in(Some(orders));
        let mut orders_relay = listener_in(Some(orders));
        let mut payments_relay = listener_in(Some(payments));
        let mut unscoped_relay = listener();
        assert!(!woken(&mut orders_relay).await);

        // A commit between two waits is seen by the next wait.
        notify_committed_in(Some(orders));
        assert!(woken(&mut orders_relay).await);
        assert!(
            !woken(&mut payments_relay).await,
            "another database's commit"
        );
        assert!(
            woken(&mut unscoped_relay).await,
            "a relay without a scope hears every commit"
        );

        notify_committed();
        assert!(
            woken(&mut orders_relay).await,
            "a commit to an unknown database"
        );
        assert!(woken(&mut payments_relay).await);
        assert!(woken(&mut unscoped_relay).await);

        // Nothing is pending afterwards.
        assert!(!orders_relay.is_pending());
        assert!(!woken(&mut orders_relay).await);
        assert!(!woken(&mut payments_relay).await);
        assert!(!woken(&mut unscoped_relay).await);

        // A signal can be seen, and taken, without waiting.
        notify_committed_in(Some(orders));
        assert!(orders_relay.is_pending());
        assert!(orders_relay.is_pending(), "seeing it does not take it");
        assert!(orders_relay.take_pending());
        assert!(!orders_relay.take_pending(), "taken once");
        assert!(
            !woken(&mut orders_relay).await,
            "a taken signal does not wake"
        );
        notify_committed();
        assert!(orders_relay.take_pending(), "through the unscoped channel");
        assert!(!woken(&mut orders_relay).await);
    }
}
