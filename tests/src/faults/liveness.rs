//! Liveness figures: how long healthy events waited while something else was
//! broken, read from the databases after a scenario.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::checker::Figures;
use super::db::Databases;
use super::model::key_name;
use super::topic::Record;

/// Milliseconds from commit to first application by `group`, for each of the
/// `ledger` events (id, commit time) that `group` applied.
async fn waits(
    dbs: &Databases,
    group: &str,
    ledger: Vec<(Uuid, DateTime<Utc>)>,
) -> Vec<(Uuid, f64)> {
    let ids: Vec<Uuid> = ledger.iter().map(|(id, _)| *id).collect();
    let applied: HashMap<Uuid, DateTime<Utc>> = dbs
        .receiver
        .first_applied(group, &ids)
        .await
        .expect("read effects");
    ledger
        .iter()
        .filter_map(|(id, committed)| {
            let at = applied.get(id)?;
            Some((*id, (*at - *committed).num_microseconds()? as f64 / 1000.0))
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank]
}

fn at_ms(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms as i64).expect("a valid instant")
}

/// The keys whose records share a partition of `key` on the topic (`key`
/// excluded).
fn partition_mates(records: &[Record], key: &str) -> HashSet<String> {
    fn key_of(r: &Record) -> Option<std::borrow::Cow<'_, str>> {
        r.key.as_deref().map(String::from_utf8_lossy)
    }
    let partitions: HashSet<i32> = records
        .iter()
        .filter(|r| key_of(r).is_some_and(|k| k == key))
        .map(|r| r.partition)
        .collect();
    records
        .iter()
        .filter(|r| partitions.contains(&r.partition))
        .filter_map(|r| key_of(r).map(|k| k.into_owned()))
        .filter(|k| k != key)
        .collect()
}

/// Blocked-key scenario: how long events of healthy keys committed while
/// `k0` was blocked waited for `group` (and, for comparison, those committed
/// before the block), and how quickly `k0` caught up. In inbox mode every
/// other key is healthy; in dedup mode a failing event holds back its
/// partition by design (its later messages wait for its retries), so the
/// keys sharing `k0`'s partition are counted apart, and healthy are the
/// keys of the other partitions.
pub async fn blocked_key(
    dbs: &Databases,
    group: &str,
    inbox: bool,
    started_ms: u64,
    window: (u64, u64),
    records: &[Record],
    figures: &mut Figures,
) {
    let (from, until) = (at_ms(window.0), at_ms(window.1));
    let blocked = key_name(0);
    let held_back: HashSet<String> = if inbox {
        HashSet::new()
    } else {
        partition_mates(records, &blocked)
    };
    let healthy_key = |key: &str| key != blocked && !held_back.contains(key);
    let before: Vec<(Uuid, DateTime<Utc>)> = dbs
        .source
        .ledger_committed(at_ms(started_ms), from)
        .await
        .expect("read ledger")
        .into_iter()
        .filter(|(_, key, _)| healthy_key(key))
        .map(|(id, _, at)| (id, at))
        .collect();
    let mut baseline: Vec<f64> = waits(dbs, group, before)
        .await
        .into_iter()
        .map(|(_, ms)| ms)
        .collect();
    baseline.sort_by(f64::total_cmp);
    let ledger = dbs
        .source
        .ledger_committed(from, until)
        .await
        .expect("read ledger");
    let (stuck, others): (Vec<_>, Vec<_>) =
        ledger.into_iter().partition(|(_, key, _)| *key == blocked);
    let (healthy, mates): (Vec<_>, Vec<_>) =
        others.into_iter().partition(|(_, key, _)| healthy_key(key));
    let strip = |rows: Vec<(Uuid, String, DateTime<Utc>)>| {
        rows.into_iter()
            .map(|(id, _, at)| (id, at))
            .collect::<Vec<_>>()
    };
    let mut healthy_waits: Vec<f64> = waits(dbs, group, strip(healthy))
        .await
        .into_iter()
        .map(|(_, ms)| ms)
        .collect();
    healthy_waits.sort_by(f64::total_cmp);
    let stuck_waits = waits(dbs, group, strip(stuck.clone())).await;
    let caught_up = stuck
        .iter()
        .filter_map(|(id, _, committed)| {
            let wait = stuck_waits.iter().find(|(i, _)| i == id)?.1;
            let applied = *committed + chrono::Duration::microseconds((wait * 1000.0) as i64);
            Some((applied - until).num_milliseconds())
        })
        .max()
        .unwrap_or(0);
    let max = healthy_waits.last().copied().unwrap_or(0.0);
    figures.healthy_wait_max = Some(
        figures
            .healthy_wait_max
            .unwrap_or_default()
            .max(Duration::from_secs_f64(max / 1000.0)),
    );
    let healthy_are = if inbox {
        "of healthy keys".to_owned()
    } else {
        let mut mate_keys: Vec<&str> = held_back.iter().map(String::as_str).collect();
        mate_keys.sort_unstable();
        let mut mate_waits: Vec<f64> = waits(dbs, group, strip(mates))
            .await
            .into_iter()
            .map(|(_, ms)| ms)
            .collect();
        mate_waits.sort_by(f64::total_cmp);
        figures.notes.push(format!(
            "group {group}: {} events of the keys sharing {blocked}'s partition ({}), held \
             back with it by design, committed meanwhile waited p50 {:.0} ms, max {:.0} ms",
            mate_waits.len(),
            mate_keys.join(", "),
            percentile(&mate_waits, 0.5),
            mate_waits.last().copied().unwrap_or(0.0),
        ));
        "of the keys of the other partitions".to_owned()
    };
    figures.notes.push(format!(
        "group {group}: key {blocked} blocked for {:.1}s with {} events committed meanwhile; \
         {} events {healthy_are} committed meanwhile waited p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; \
         the blocked key caught up {:.1}s after it was unblocked \
         (before the block, {} healthy events waited p50 {:.0} ms, p99 {:.0} ms)",
        (until - from).num_milliseconds() as f64 / 1000.0,
        stuck.len(),
        healthy_waits.len(),
        percentile(&healthy_waits, 0.5),
        percentile(&healthy_waits, 0.99),
        max,
        caught_up as f64 / 1000.0,
        baseline.len(),
        percentile(&baseline, 0.5),
        percentile(&baseline, 0.99),
    ));
}

/// Rolling-deploy scenario: the `LedgerNote` rows the inbox received before
/// the new version started, and how long they waited for it.
pub async fn rolling_deploy(dbs: &Databases, deployed_at: DateTime<Utc>, figures: &mut Figures) {
    let (waited, longest, parked): (i64, Option<f64>, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE event_type = 'LedgerNote' AND received_at < $1),
                max(EXTRACT(EPOCH FROM processed_at - received_at)::float8)
                    FILTER (WHERE event_type = 'LedgerNote' AND received_at < $1),
                count(*) FILTER (WHERE parked_at IS NOT NULL)
         FROM inbox_event WHERE consumer_group = 'inbox'",
    )
    .bind(deployed_at)
    .fetch_one(dbs.receiver.postgres())
    .await
    .expect("read inbox");
    figures.notes.push(format!(
        "rolling deploy: {waited} LedgerNote rows received before the new version started \
         waited for it (longest {:.1}s); rows parked: {parked}",
        longest.unwrap_or(0.0)
    ));
}
