#![deny(warnings)]
//! Functions and methods of the user's own called `now`, `spawn`, `random` and `sleep` are not
//! the clock, tasks, randomness or timers the scan looks for.

use workflow_core::prelude::*;

struct Clock;

impl Clock {
    fn now(&self) -> u64 {
        7
    }

    fn sleep(&self, _ticks: u64) {}
}

struct Pool;

impl Pool {
    fn spawn(&self, job: u64) -> u64 {
        job
    }

    fn random(&self) -> u64 {
        4
    }
}

fn spawn(job: u64) -> u64 {
    job
}

mod jobs {
    pub fn spawn(job: u64) -> u64 {
        job
    }

    pub fn sleep(_ticks: u64) {}

    pub fn now() -> u64 {
        1
    }
}

#[workflow]
async fn schedule(order_id: String) -> Result<u64> {
    let clock = Clock;
    let pool = Pool;
    clock.sleep(1);
    jobs::sleep(1);
    let total = clock.now() + jobs::now() + pool.spawn(1) + spawn(2) + jobs::spawn(3);
    let _ = order_id;
    Ok(total + pool.random())
}

fn main() {}
