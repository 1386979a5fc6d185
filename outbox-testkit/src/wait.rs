use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Checks `condition` every 50 ms until it returns true.
///
/// # Panics
/// With "timed out waiting for {what}" when `timeout` passed and the last
/// check still returned false.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
