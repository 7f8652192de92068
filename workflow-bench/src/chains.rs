//! Continue-as-new: the cost of one continuation, a chain of runs each of which
//! continues as the next at once (no steps), timed from the first run's start to the chain's
//! end and divided by the continuations: the seam's transaction (the run's last event, its
//! end, the next run's admission with what it inherits) plus the next run's lease and first
//! poll. SQLite and PostgreSQL.

use std::time::Instant;

use workflow_core::prelude::*;

use crate::report::{median, Report, Row, Unit};
use crate::scenarios::{progress, Ctx};
use crate::stores::StoreKind;
use crate::BoxResult;

#[workflow(name = "bench.count_down")]
async fn count_down(n: u32) -> Result<u32> {
    if n == 0 {
        return Ok(0);
    }
    continue_as_new(count_down, (n - 1,)).await
}

pub async fn continue_as_new_cost(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let continuations = ctx.sizes.w1_steps.max(2);
    for kind in ctx.stores(&[Sqlite, Postgres], rep) {
        progress(format!("continue-as-new {}", kind.name()));
        let mut per = Vec::new();
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            let t = Instant::now();
            rt.start(count_down, (continuations,))
                .await?
                .return_value()
                .await?;
            per.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(continuations));
            rt.shutdown();
            fresh.cleanup().await?;
        }
        let s = kind.name();
        println!(
            "continue-as-new {s}: {:.0} us per continuation (end + admit + the next run begun), \
             {continuations} continuations",
            median(&per)
        );
        rep.push(
            Row::new(
                "continue-as-new",
                s,
                "per continuation (end + admit, next run begun)",
                Unit::Micros,
            )
            .samples(per),
        );
    }
    Ok(())
}
