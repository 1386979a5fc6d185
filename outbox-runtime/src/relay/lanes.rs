//! Lane ownership: which partition keys this relay may publish.
//!
//! Keys are hashed into `lanes` lanes. A relay owns a lane while it holds the
//! session-level advisory lock `(LANE_LOCK, lane)` on its dedicated
//! connection; PostgreSQL releases the lock when that connection ends, so a
//! relay that dies or loses its connection loses its lanes at once and
//! another relay takes them over. Because the claim and the mark run on that
//! same connection, a relay whose connection (and thus ownership) is gone
//! cannot mark anything and drops its lanes on the first failed statement.
//!
//! Every relay also holds a membership lock `(MEMBER_LOCK, backend pid)`;
//! counting those in `pg_locks` gives the number of live relays, and each
//! relay aims at `ceil(lanes / relays)` lanes, releasing extra lanes (only
//! between batches, when nothing of theirs is in flight) and taking free ones.

use std::collections::BTreeSet;

use sqlx::{Connection, PgConnection, PgPool};

/// Advisory lock class of lane locks ("obxl").
const LANE_LOCK: i32 = 0x6f62_786c;
/// Advisory lock class of relay membership locks ("obxm").
const MEMBER_LOCK: i32 = 0x6f62_786d;

/// What [`Lanes::rebalance`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Rebalanced {
    /// Lanes taken as needed; the relay owns its share (or all it could get).
    Done,
    /// Above its share, but releasing was not allowed: settle, then call again.
    MustRelease,
}

/// The dedicated connection and the lanes locked on it.
#[derive(Debug)]
pub(crate) struct Lanes {
    lane_count: u32,
    conn: Option<PgConnection>,
    owned: BTreeSet<i32>,
}

impl Lanes {
    pub(crate) fn new(lane_count: u32) -> Self {
        Self {
            lane_count,
            conn: None,
            owned: BTreeSet::new(),
        }
    }

    pub(crate) fn lane_count(&self) -> u32 {
        self.lane_count
    }

    /// The lanes this relay currently owns, ascending.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.owned.iter().copied().collect()
    }

    /// The connection the locks live on; `None` until [`rebalance`](Self::rebalance) succeeded.
    pub(crate) fn connection(&mut self) -> Option<&mut PgConnection> {
        self.conn.as_mut()
    }

    /// Forgets the connection (and with it every lane): called after any error
    /// on it, since the session and its locks may be gone.
    pub(crate) fn reset(&mut self) {
        self.owned.clear();
        // Dropping closes the socket; the server then frees the locks.
        self.conn = None;
    }

    /// Connects if needed, then takes or releases lanes towards a fair share.
    ///
    /// Releasing a lane is only safe while none of this relay's batches is in
    /// flight (its next owner could overtake them): with `may_release` false,
    /// a relay above its share keeps its lanes and `Ok(Rebalanced::MustRelease)`
    /// asks the caller to settle its batches and call again.
    pub(crate) async fn rebalance(
        &mut self,
        pool: &PgPool,
        may_release: bool,
    ) -> sqlx::Result<Rebalanced> {
        if self.conn.is_none() {
            let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
            super::store::configure_connection(&mut conn).await?;
            sqlx::query("SELECT pg_advisory_lock($1, pg_backend_pid())")
                .bind(MEMBER_LOCK)
                .execute(&mut conn)
                .await?;
            self.conn = Some(conn);
        }
        let result = self.rebalance_on_connection(may_release).await;
        if result.is_err() {
            self.reset();
        }
        result
    }

    async fn rebalance_on_connection(&mut self, may_release: bool) -> sqlx::Result<Rebalanced> {
        let conn = self.conn.as_mut().expect("connected above");
        let (members, me): (i64, i32) = sqlx::query_as(
            "SELECT count(*), pg_backend_pid() FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objsubid = 2
               AND classid = $1::int::oid
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind(MEMBER_LOCK)
        .fetch_one(&mut *conn)
        .await?;
        let members = members.max(1) as u32;
        let target = self.lane_count.div_ceil(members) as usize;

        if self.owned.len() > target && !may_release {
            return Ok(Rebalanced::MustRelease);
        }
        while self.owned.len() > target {
            let lane = *self.owned.last().expect("non-empty");
            sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                .bind(LANE_LOCK)
                .bind(lane)
                .execute(&mut *conn)
                .await?;
            self.owned.remove(&lane);
        }
        if self.owned.len() < target {
            // Start at a pid-dependent lane so relays starting together try
            // different lanes first instead of all racing for lane 0.
            let start = me.unsigned_abs() % self.lane_count;
            for step in 0..self.lane_count {
                if self.owned.len() >= target {
                    break;
                }
                let lane = ((start + step) % self.lane_count) as i32;
                if self.owned.contains(&lane) {
                    continue;
                }
                let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
                    .bind(LANE_LOCK)
                    .bind(lane)
                    .fetch_one(&mut *conn)
                    .await?;
                if locked {
                    self.owned.insert(lane);
                }
            }
        }
        Ok(Rebalanced::Done)
    }

    /// Releases every lane and the membership (graceful shutdown), so other
    /// relays can take over without waiting for the connection to time out.
    pub(crate) async fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close().await;
        }
        self.owned.clear();
    }
}
