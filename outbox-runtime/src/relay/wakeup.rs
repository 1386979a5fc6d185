//! What wakes an idle relay besides its poll timer: commits of its own
//! process and, with `listen_notify`, notifications from other processes.

use std::sync::Arc;

use tokio::sync::Notify;
use txoutbox_core::wakeup::CommitListener;

/// The relay's wake-up sources.
pub(crate) struct Wakeups {
    local: CommitListener,
    remote: Option<Arc<Notify>>,
}

impl Wakeups {
    pub(crate) fn new(local: CommitListener, remote: Option<Arc<Notify>>) -> Self {
        Self { local, remote }
    }

    /// Returns at the next commit signal or notification.
    pub(crate) async fn committed(&mut self) {
        match &self.remote {
            Some(remote) => tokio::select! {
                () = self.local.committed() => {}
                () = remote.notified() => {}
            },
            None => self.local.committed().await,
        }
    }
}
