//! Graceful shutdown of a worker's client connections: the accept loop signals, each connection
//! finishes what it is doing (HTTP/1 the response in progress, with `Connection: close`; HTTP/2
//! its streams, after GOAWAY) and closes, and the loop waits until all have.
//!
//! hyper-util has the same for hyper's own connections only; the HTTP/1 fast path is not one.

use tokio::sync::watch;

/// The accept loop's side: signals and counts connections.
pub(crate) struct Drain(watch::Sender<bool>);

/// A connection's side: the signal to finish.
pub(crate) struct DrainWatch(watch::Receiver<bool>);

impl Drain {
    pub(crate) fn new() -> Self {
        Self(watch::Sender::new(false))
    }

    /// The signal for one more connection, counted until dropped.
    pub(crate) fn watch(&self) -> DrainWatch {
        DrainWatch(self.0.subscribe())
    }

    /// Connections not yet closed.
    pub(crate) fn count(&self) -> usize {
        self.0.receiver_count()
    }

    /// Signals every connection to finish, and waits until all have closed.
    pub(crate) async fn shutdown(self) {
        self.0.send_replace(true);
        self.0.closed().await;
    }
}

impl DrainWatch {
    /// Whether connections were asked to finish.
    pub(crate) fn is_signalled(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once connections are asked to finish (or the accept loop is gone).
    pub(crate) async fn signalled(&mut self) {
        let _ = self.0.wait_for(|&finish| finish).await;
    }
}
