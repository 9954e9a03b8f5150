//! The proxier's health as kube-proxy's `/healthz` and `/livez` report it (pure: the caller
//! passes the clock).
//!
//! kube-proxy's meaning: the proxier is healthy unless a queued change has waited longer than the
//! health timeout (2 × `syncPeriod`) without being applied; a failed sync leaves its changes
//! queued, so a proxier that keeps failing turns unhealthy once the timeout has passed.

use std::time::{Duration, Instant, SystemTime};

/// What the health endpoints report: when changes were queued and applied.
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    /// How long a queued change may wait before the proxier counts as unhealthy.
    timeout: Duration,
    /// When the oldest change not applied yet was queued.
    oldest_queued: Option<Instant>,
    /// Wall time of the last successful sync.
    last_updated: Option<SystemTime>,
    /// False while this node is being deleted (see [`crate::node::node_eligible`]).
    node_eligible: bool,
}

impl ProxyHealth {
    /// A proxier that has not synced yet and has nothing queued, with the given health timeout
    /// (kube-proxy uses 2 × `syncPeriod`).
    pub fn new(timeout: Duration) -> Self {
        ProxyHealth { timeout, oldest_queued: None, last_updated: None, node_eligible: true }
    }

    /// A change is waiting for a sync (kube-proxy's `QueuedUpdate`); only the oldest counts.
    pub fn queued(&mut self, now: Instant) {
        self.oldest_queued.get_or_insert(now);
    }

    /// A sync applied every queued change (kube-proxy's `Updated`).
    pub fn synced(&mut self, wall: SystemTime) {
        self.oldest_queued = None;
        self.last_updated = Some(wall);
    }

    /// A sync failed: its changes stay queued (since `now` if nothing was queued before, e.g. a
    /// failed first sync).
    pub fn sync_failed(&mut self, now: Instant) {
        self.queued(now);
    }

    /// True when no queued change is older than the timeout.
    pub fn healthy(&self, now: Instant) -> bool {
        self.oldest_queued.is_none_or(|queued| now.saturating_duration_since(queued) < self.timeout)
    }

    /// Wall time of the last successful sync, if any.
    pub fn last_updated(&self) -> Option<SystemTime> {
        self.last_updated
    }

    /// Records whether this node should still receive load-balancer traffic.
    pub fn set_node_eligible(&mut self, eligible: bool) {
        self.node_eligible = eligible;
    }

    /// Whether this node should still receive load-balancer traffic (`/healthz` fails when not;
    /// `/livez` ignores it).
    pub fn node_eligible(&self) -> bool {
        self.node_eligible
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(60);

    #[test]
    fn a_fresh_proxier_is_healthy_and_has_not_synced() {
        let health = ProxyHealth::new(TIMEOUT);
        assert!(health.healthy(Instant::now()));
        assert_eq!(health.last_updated(), None);
        assert!(health.node_eligible());
    }

    #[test]
    fn a_queued_change_turns_unhealthy_only_after_the_timeout() {
        let start = Instant::now();
        let mut health = ProxyHealth::new(TIMEOUT);
        health.queued(start);
        assert!(health.healthy(start + TIMEOUT - Duration::from_secs(1)));
        // A later change does not reset the clock of the oldest one.
        health.queued(start + Duration::from_secs(30));
        assert!(!health.healthy(start + TIMEOUT));
    }

    #[test]
    fn a_sync_recovers_a_stale_proxier() {
        let start = Instant::now();
        let mut health = ProxyHealth::new(TIMEOUT);
        health.queued(start);
        assert!(!health.healthy(start + 2 * TIMEOUT));
        let wall = SystemTime::now();
        health.synced(wall);
        assert!(health.healthy(start + 2 * TIMEOUT));
        assert_eq!(health.last_updated(), Some(wall));
    }

    #[test]
    fn failing_syncs_turn_unhealthy_once_their_changes_waited_past_the_timeout() {
        let start = Instant::now();
        let mut health = ProxyHealth::new(TIMEOUT);
        let wall = SystemTime::now();
        health.synced(wall);
        health.queued(start);
        health.sync_failed(start + Duration::from_secs(1));
        assert!(health.healthy(start + Duration::from_secs(2)), "within the timeout, as kube-proxy");
        health.sync_failed(start + TIMEOUT);
        assert!(!health.healthy(start + TIMEOUT), "the oldest queued change counts");
        assert_eq!(health.last_updated(), Some(wall), "the last successful sync is kept");
        health.synced(SystemTime::now());
        assert!(health.healthy(start + 3 * TIMEOUT));
    }
}
