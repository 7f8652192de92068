//! The waker the driver polls the workflow future with: it records that the future was woken
//! and wakes the driver's own task, so the driver polls the workflow again only when something
//! inside it asked to be.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake};

use futures::task::AtomicWaker;

/// Wakes the driver when anything inside the workflow future is woken.
pub(super) struct FlagWaker {
    /// Set by a wake, cleared before each poll of the workflow future.
    pub(super) woken: AtomicBool,
    /// The driver's task while it waits in its `select!`.
    pub(super) driver: AtomicWaker,
}

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.driver.wake();
    }
}

impl FlagWaker {
    /// Ready once the workflow future was woken after its last poll. (A wake during a poll is
    /// already handled by polling again, so it costs no extra round of the driver's loop.)
    pub(super) fn woken(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            self.driver.register(cx.waker());
            if self.woken.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}
