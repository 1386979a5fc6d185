//! Lane ownership: which partition keys this relay may publish.
//!
//! Keys are hashed into `lanes` lanes. A relay owns a lane while it holds the
//! lane's session-level lock on its dedicated connection (an advisory lock
//! `(LANE_LOCK, lane)` on PostgreSQL, a named lock on MySQL, see
//! [`Backend`]); the server releases the lock when that session ends, so a
//! relay that dies or loses its connection loses its lanes and another relay
//! takes them over. Because the claim and the mark run on that same
//! connection, a relay whose session (and thus ownership) is gone cannot mark
//! anything and drops its lanes on the first failed statement.
//!
//! Every relay is also a member (see [`membership`](super::membership)):
//! joining refuses a relay whose lane count differs from a live member's;
//! the member's lease is renewed at least every `min(rebalance_interval,
//! lease_timeout / 3)` on the same connection, and a relay ends the session
//! of a member whose lease has expired (a frozen or vanished host), which
//! frees its lanes at once. Every statement on the connection is bounded by
//! `database_timeout`; after it the relay drops the connection and its lanes
//! itself. Each relay aims at `ceil(lanes / members)` lanes (members that
//! cannot reach the broker hand theirs to those that can), releasing extra
//! lanes only between batches, when nothing of theirs is in flight, and
//! taking free ones.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::backend::{Backend, Joined};
use super::config::{RelayConfig, renew_every};
use super::error::RelayError;
use super::held_topics::HeldTopicRecord;
use super::membership::{Identity, JoinError, Renewal};
use super::session::bounded;
use super::telemetry as metric;

/// What [`Lanes::rebalance`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rebalanced {
    /// Lanes taken as needed; the relay owns its share (or all it could get).
    Done,
    /// Above its share, but releasing was not allowed: settle, then call again.
    MustRelease,
}

/// The relay's own session: its id on the server and the mark it set on it.
#[derive(Debug, Clone, Copy)]
struct Session {
    id: Uuid,
    backend_id: i64,
    /// The membership table has `held_topics` (migration 0011).
    records_held_topics: bool,
}

/// The dedicated connection, the membership and the lanes locked on it.
pub(crate) struct Lanes<B: Backend> {
    identity: Identity,
    database_timeout: Duration,
    renew_every: Duration,
    conn: Option<B::Conn>,
    session: Option<Session>,
    owned: BTreeSet<i32>,
    next_renewal: Instant,
    broker_failing: bool,
    /// The held topics as JSON, recorded at every renewal.
    held_topics: String,
    /// A reason to stop for good (refused lane count, shared session...),
    /// taken by the worker at its next turn.
    fatal: Option<RelayError>,
}

impl<B: Backend> Lanes<B> {
    pub(crate) fn new(config: &RelayConfig) -> Self {
        Self {
            identity: Identity::new(config.lanes, config.lease_timeout),
            database_timeout: config.database_timeout,
            renew_every: renew_every(config),
            conn: None,
            session: None,
            owned: BTreeSet::new(),
            next_renewal: Instant::now(),
            broker_failing: false,
            held_topics: "[]".to_owned(),
            fatal: None,
        }
    }

    pub(crate) fn lane_count(&self) -> u32 {
        self.identity.lanes
    }

    /// The lanes this relay currently owns, ascending.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.owned.iter().copied().collect()
    }

    /// The connection the locks live on; `None` until [`rebalance`](Self::rebalance) succeeded.
    pub(crate) fn connection(&mut self) -> Option<&mut B::Conn> {
        self.conn.as_mut()
    }

    /// The error that must stop the relay, if one happened.
    pub(crate) fn take_fatal(&mut self) -> Option<RelayError> {
        self.fatal.take()
    }

    /// Records whether the relay's batches fail because the broker cannot be
    /// reached. Such a member hands its lanes to members that can publish
    /// (at its next rebalance), and others see it at its next renewal.
    pub(crate) fn set_broker_failing(&mut self, failing: bool) {
        if failing != self.broker_failing {
            metrics::gauge!(metric::BROKER_FAILING).set(f64::from(u8::from(failing)));
            if failing {
                tracing::warn!(
                    "outbox relay cannot reach the broker: it hands its lanes to relays \
                     that can, if there are any"
                );
            } else {
                tracing::info!("outbox relay reaches the broker again");
            }
        }
        self.broker_failing = failing;
    }

    pub(crate) fn broker_failing(&self) -> bool {
        self.broker_failing
    }

    /// Records the topics this relay holds (the broker refuses them), for
    /// `outbox status`: written at the next renewal, which is brought
    /// forward to now.
    pub(crate) fn set_held_topics(&mut self, held: &[HeldTopicRecord]) {
        self.held_topics = serde_json::to_string(held).expect("plain data serializes");
        self.next_renewal = Instant::now();
    }

    /// Forgets the connection (and with it every lane): called after any error
    /// on it, since the session and its locks may be gone.
    pub(crate) fn reset(&mut self) {
        self.owned.clear();
        self.session = None;
        // Dropping closes the socket; the server then ends the session and
        // frees the locks (or another relay ends it when the lease expires,
        // if the socket is frozen).
        self.conn = None;
    }

    /// When the lease must be renewed next (far ahead while not connected).
    pub(crate) fn renew_at(&self) -> Instant {
        if self.conn.is_some() {
            self.next_renewal
        } else {
            Instant::now() + Duration::from_secs(3600)
        }
    }

    /// Renews the lease now (a no-op while not connected). The worker calls
    /// it while it waits for the broker, so that a healthy relay's lease
    /// never runs out between rebalances. On error the lanes are dropped.
    pub(crate) async fn renew(&mut self) -> sqlx::Result<()> {
        if self.conn.is_none() {
            return Ok(());
        }
        let limit = self.database_timeout;
        let result = bounded(limit, "renewing the lease", self.renew_on_connection()).await;
        if let Err(error) = &result {
            self.note_pooler(error);
            self.reset();
        }
        result
    }

    /// A dedicated connection never meets someone else's prepared statements:
    /// that is a pooler handing statements to other server sessions.
    fn note_pooler(&mut self, error: &sqlx::Error) {
        if B::shows_shared_session(error) && self.fatal.is_none() {
            self.fatal = Some(RelayError::SharedSession(format!(
                "its prepared statements are unknown to the server session or exist there \
                 already: {error}"
            )));
        }
    }

    async fn renew_on_connection(&mut self) -> sqlx::Result<()> {
        let (Some(conn), Some(session)) = (self.conn.as_mut(), self.session) else {
            return Ok(());
        };
        let held_topics = session
            .records_held_topics
            .then_some(self.held_topics.as_str());
        let renewal = B::renew(
            conn,
            session.id,
            session.backend_id,
            self.broker_failing,
            held_topics,
        )
        .await?;
        match renewal {
            Renewal::Renewed => {
                self.next_renewal = Instant::now() + self.renew_every;
                Ok(())
            }
            Renewal::RowGone => Err(sqlx::Error::Protocol(
                "the relay's membership row was removed; joining again".into(),
            )),
            Renewal::SharedSession(detail) => {
                Err(self.stop_for_good(RelayError::SharedSession(detail)))
            }
        }
    }

    fn stop_for_good(&mut self, error: RelayError) -> sqlx::Error {
        let text = error.to_string();
        self.fatal = Some(error);
        sqlx::Error::Protocol(text)
    }

    /// Connects and joins if needed, renews the lease, ends the sessions of
    /// members whose lease expired, then takes or releases lanes towards a
    /// fair share.
    ///
    /// Releasing a lane is only safe while none of this relay's batches is in
    /// flight (its next owner could overtake them): with `may_release` false,
    /// a relay above its share keeps its lanes and `Ok(Rebalanced::MustRelease)`
    /// asks the caller to settle its batches and call again.
    pub(crate) async fn rebalance(
        &mut self,
        database: &B,
        may_release: bool,
    ) -> sqlx::Result<Rebalanced> {
        let limit = self.database_timeout;
        let result = bounded(limit, "lane rebalance", async {
            if self.conn.is_none() {
                self.join(database).await?;
            }
            self.renew_on_connection().await?;
            self.rebalance_on_connection(may_release).await
        })
        .await;
        if let Err(error) = &result {
            self.note_pooler(error);
            self.reset();
        }
        result
    }

    async fn join(&mut self, database: &B) -> sqlx::Result<()> {
        let joined = match database.join(&self.identity).await {
            Ok(joined) => joined,
            Err(JoinError::Database(error)) => return Err(error),
            Err(JoinError::LaneCount(member)) => {
                return Err(self.stop_for_good(RelayError::LaneCountMismatch {
                    configured: self.identity.lanes,
                    running: member.lanes as u32,
                    member: member.to_string(),
                }));
            }
            Err(JoinError::SharedSession(detail)) => {
                return Err(self.stop_for_good(RelayError::SharedSession(detail)));
            }
            Err(JoinError::NotMigrated) => return Err(self.stop_for_good(RelayError::NotMigrated)),
            Err(JoinError::Unsupported(detail)) => {
                return Err(self.stop_for_good(RelayError::UnsupportedDatabase(detail)));
            }
        };
        let Joined {
            conn,
            session: id,
            backend_id,
            records_held_topics,
        } = joined;
        if !records_held_topics {
            tracing::warn!(
                "outbox relay: migration 0011 is not applied, so `outbox status` cannot show \
                 the topics this relay holds (the relay works all the same; run the outbox \
                 migrations)"
            );
        }
        self.session = Some(Session {
            id,
            backend_id,
            records_held_topics,
        });
        self.conn = Some(conn);
        Ok(())
    }

    async fn rebalance_on_connection(&mut self, may_release: bool) -> sqlx::Result<Rebalanced> {
        let conn = self.conn.as_mut().expect("connected above");
        let session = self.session.expect("joined with the connection");
        for ended in B::evict_expired(conn).await? {
            metrics::counter!(metric::MEMBERS_EVICTED).increment(1);
            tracing::warn!(
                member = %ended.member,
                silent_for_s = format!("{:.1}", ended.silent_for),
                "outbox relay ended the session of a relay whose lease expired \
                 (frozen or vanished); its lanes are free for the others"
            );
        }
        let (members, able) = B::census(conn).await?;
        let lane_count = self.identity.lanes;
        let target = match (self.broker_failing, able) {
            // Someone can publish: leave the lanes to them.
            (true, 1..) => 0,
            // Nobody can: moving lanes would not help.
            (true, 0) => lane_count.div_ceil(members),
            (false, _) => lane_count.div_ceil(able.max(1)),
        } as usize;

        if self.owned.len() > target && !may_release {
            return Ok(Rebalanced::MustRelease);
        }
        while self.owned.len() > target {
            let lane = *self.owned.last().expect("non-empty");
            B::unlock_lane(conn, lane).await?;
            self.owned.remove(&lane);
        }
        if self.owned.len() < target {
            // Start at a pid-dependent lane so relays starting together try
            // different lanes first instead of all racing for lane 0.
            let start = (session.backend_id.unsigned_abs() % u64::from(lane_count)) as u32;
            for step in 0..lane_count {
                if self.owned.len() >= target {
                    break;
                }
                let lane = ((start + step) % lane_count) as i32;
                if self.owned.contains(&lane) {
                    continue;
                }
                if B::try_lock_lane(conn, lane).await? {
                    self.owned.insert(lane);
                }
            }
        }
        Ok(Rebalanced::Done)
    }

    /// Releases every lane and the membership (graceful shutdown), so other
    /// relays can take over without waiting for the lease to expire.
    pub(crate) async fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            let limit = self.database_timeout;
            let _ = bounded(limit, "leaving", B::leave(conn)).await;
        }
        self.session = None;
        self.owned.clear();
    }
}
