//! Writing statuses to the API server from a background task (thin), for `ingress` and
//! `gateway`: at most one write queued per object (a later one replaces it), each retried with
//! backoff until it lands, superseded, or the object is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::time::Duration;

use roadkeeper_cluster::kube;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Delay before retrying a failed write, doubled after each failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest delay between two attempts of a failing write.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The writer task: writes each queued `(object, status)` with `patch`, in turn, until `updates`
/// closes. `what` names the status in logs (`status.loadBalancer`).
pub async fn run<K, V, F, Fut>(what: &str, mut updates: mpsc::UnboundedReceiver<(K, V)>, patch: F)
where
    K: Ord + Clone + Display,
    V: Clone,
    F: Fn(K, V) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let mut queue = Queue::default();
    loop {
        let due = queue.next_due();
        tokio::select! {
            update = updates.recv() => match update {
                Some((key, value)) => queue.push(key, value, 0, Instant::now()),
                None => return,
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let Some((key, value, failures)) = queue.pop() else { continue };
                let result = patch(key.clone(), value.clone()).await;
                // Updates sent meanwhile supersede this one, should it have failed.
                while let Ok((newer, value)) = updates.try_recv() {
                    queue.push(newer, value, 0, Instant::now());
                }
                match result {
                    Ok(()) => tracing::debug!("{key}: {what} written"),
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        tracing::debug!("{key}: deleted before its {what} was written");
                    }
                    Err(err) if queue.contains(&key) => tracing::warn!("{key}: writing {what}: {err}; superseded"),
                    Err(err) => {
                        let delay = RETRY_MIN.saturating_mul(1 << failures.min(16)).min(RETRY_MAX);
                        tracing::warn!("{key}: writing {what}: {err}; retrying in {delay:?}");
                        queue.push(key, value, failures + 1, Instant::now() + delay);
                    }
                }
            }
        }
    }
}

/// Writes waiting for their turn, at most one per object, taken in order of due time.
struct Queue<K, V> {
    /// Per object: when, the write, and how many attempts of it failed.
    pending: BTreeMap<K, (Instant, V, u32)>,
    by_due: BTreeSet<(Instant, K)>,
}

impl<K, V> Default for Queue<K, V> {
    fn default() -> Self {
        Self { pending: BTreeMap::new(), by_due: BTreeSet::new() }
    }
}

impl<K: Ord + Clone, V> Queue<K, V> {
    /// Queues `value` for `key` (after `failures` failed attempts) for `due`, replacing the
    /// queued write of the same object.
    fn push(&mut self, key: K, value: V, failures: u32, due: Instant) {
        if let Some((old, ..)) = self.pending.insert(key.clone(), (due, value, failures)) {
            self.by_due.remove(&(old, key.clone()));
        }
        self.by_due.insert((due, key));
    }

    /// When the first queued write is due.
    fn next_due(&self) -> Option<Instant> {
        self.by_due.first().map(|(due, _)| *due)
    }

    /// Takes the first write due, with its failure count.
    fn pop(&mut self) -> Option<(K, V, u32)> {
        let (_, key) = self.by_due.pop_first()?;
        let (_, value, failures) = self.pending.remove(&key)?;
        Some((key, value, failures))
    }

    fn contains(&self, key: &K) -> bool {
        self.pending.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_write_replaces_the_queued_one_of_the_same_object() {
        let now = Instant::now();
        let mut queue = Queue::default();
        queue.push("a", "old", 2, now + Duration::from_secs(4));
        queue.push("b", "b", 0, now + Duration::from_secs(1));
        queue.push("a", "new", 0, now);
        assert_eq!(queue.next_due(), Some(now));
        assert!(queue.contains(&"a"));
        assert_eq!(queue.pop(), Some(("a", "new", 0)));
        assert_eq!(queue.pop(), Some(("b", "b", 0)));
        assert_eq!((queue.pop(), queue.next_due()), (None, None));
    }
}
