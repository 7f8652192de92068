//! The five usual ways to handle a duplicate run, as ordinary code. Each duplicate run learns
//! the owner of the contested token from `get_conflict()` and decides:
//!
//! 1. reject: report the owner and stop;
//! 2. adopt: wait for the owner's result and return it;
//! 3. inspect: branch on the owner's live status;
//! 4. forward: deliver this run's input to the owner's hook;
//! 5. supersede: cancel the owner, then claim the released token (newest wins).
//!
//! ```text
//! cargo run --example conflict_strategies
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use workflow_core::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderRequest {
    confirmed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OrderResult {
    Processed { confirmed: bool },
    Duplicate { run_id: RunId },
    Forwarded { run_id: RunId },
}

/// The owner: claims `order:<id>` and waits for the confirmation.
#[workflow]
async fn process_order(order_id: String) -> Result<OrderResult> {
    let mut request = create_hook::<OrderRequest>(format!("order:{order_id}"));
    if let Some(conflict) = request.get_conflict().await {
        // 1. Reject the duplicate.
        return Ok(OrderResult::Duplicate {
            run_id: conflict.run_id,
        });
    }
    let OrderRequest { confirmed } = request.recv().await?;
    Ok(OrderResult::Processed { confirmed })
}

#[step]
async fn owner_result(run_id: RunId) -> Result<OrderResult> {
    workflow_core::api::get_run(&run_id)?
        .typed()
        .return_value()
        .await
}

#[step]
async fn owner_status(run_id: RunId) -> Result<RunStatus> {
    Ok(workflow_core::api::get_run(&run_id)?.status().await?)
}

#[step]
async fn forward_to_owner(token: String, payload: OrderRequest) -> Result<RunId> {
    Ok(workflow_core::api::resume_hook(token, payload)
        .await?
        .run_id)
}

#[step]
async fn cancel_owner(run_id: RunId) -> Result<()> {
    workflow_core::api::get_run(&run_id)?.cancel().await?;
    Ok(())
}

/// 2. Adopt the owner's result: callers cannot tell which run did the work.
#[workflow]
async fn adopt(order_id: String) -> Result<OrderResult> {
    let mut request = create_hook::<OrderRequest>(format!("order:{order_id}"));
    if let Some(conflict) = request.get_conflict().await {
        return owner_result(conflict.run_id).await;
    }
    let OrderRequest { confirmed } = request.recv().await?;
    Ok(OrderResult::Processed { confirmed })
}

/// 3. Inspect the owner before deciding.
#[workflow]
async fn inspect(order_id: String) -> Result<OrderResult> {
    let mut request = create_hook::<OrderRequest>(format!("order:{order_id}"));
    if let Some(conflict) = request.get_conflict().await {
        if owner_status(conflict.run_id).await? == RunStatus::Running {
            return Ok(OrderResult::Duplicate {
                run_id: conflict.run_id,
            });
        }
        // The owner already ended: its token is being released; report it all the same.
        return owner_result(conflict.run_id).await;
    }
    let OrderRequest { confirmed } = request.recv().await?;
    Ok(OrderResult::Processed { confirmed })
}

/// 4. Signal the owner instead of doing the work.
#[workflow]
async fn forward(order_id: String, confirmed: bool) -> Result<OrderResult> {
    let token = format!("order:{order_id}");
    let mut request = create_hook::<OrderRequest>(token.clone());
    if request.get_conflict().await.is_some() {
        let run_id = forward_to_owner(token, OrderRequest { confirmed }).await?;
        return Ok(OrderResult::Forwarded { run_id });
    }
    let OrderRequest { confirmed } = request.recv().await?;
    Ok(OrderResult::Processed { confirmed })
}

/// 5. Supersede the owner: cancel it, then claim the released token, a bounded number of times.
#[workflow]
async fn newest_wins(order_id: String) -> Result<OrderResult> {
    let token = format!("order:{order_id}");
    for _attempt in 0..3 {
        let mut request = create_hook::<OrderRequest>(token.clone());
        match request.get_conflict().await {
            None => {
                let OrderRequest { confirmed } = request.recv().await?;
                return Ok(OrderResult::Processed { confirmed });
            }
            Some(conflict) => cancel_owner(conflict.run_id).await?,
        }
    }
    Err(Error::fatal(format!(
        "could not claim {token} after cancelling its owner"
    )))
}

/// Starts an owner for `order` and waits until it owns the token.
async fn owner(
    rt: &Runtime,
    order: &str,
) -> std::result::Result<Run<OrderResult>, Box<dyn std::error::Error>> {
    let run = rt.start(process_order, (order.to_string(),)).await?;
    while rt
        .get_hook_by_token(format!("order:{order}"))
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(run)
}

/// Waits until `run` has met the token (recorded its registration).
async fn met_token(
    rt: &Runtime,
    run: RunId,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use workflow_core::store::Event;
    while !rt
        .store()
        .events(&run)
        .await?
        .iter()
        .any(|e| matches!(e.event, Event::HookRegistered { .. }))
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| "strategies.db".into());
    let rt = Runtime::builder().sqlite(&db).build().await?;
    let suffix = RunId::new().to_string();
    let yes = OrderRequest { confirmed: true };

    let order = format!("reject-{suffix}");
    let first = owner(&rt, &order).await?;
    let dup = rt.start(process_order, (order.clone(),)).await?;
    println!(
        "1. reject:    duplicate returned {:?}",
        dup.return_value().await?
    );
    rt.resume_hook(format!("order:{order}"), yes.clone())
        .await?;
    println!(
        "              owner {} returned {:?}",
        first.id(),
        first.return_value().await?
    );

    let order = format!("adopt-{suffix}");
    let first = owner(&rt, &order).await?;
    let dup = rt.start(adopt, (order.clone(),)).await?;
    met_token(&rt, dup.id()).await?;
    rt.resume_hook(format!("order:{order}"), yes.clone())
        .await?;
    println!(
        "2. adopt:     owner returned {:?}, duplicate returned {:?}",
        first.return_value().await?,
        dup.return_value().await?
    );

    let order = format!("inspect-{suffix}");
    let first = owner(&rt, &order).await?;
    let dup = rt.start(inspect, (order.clone(),)).await?;
    println!(
        "3. inspect:   owner is running, duplicate returned {:?}",
        dup.return_value().await?
    );
    rt.resume_hook(format!("order:{order}"), yes.clone())
        .await?;
    first.return_value().await?;

    let order = format!("forward-{suffix}");
    let first = owner(&rt, &order).await?;
    let dup = rt.start(forward, (order.clone(), false)).await?;
    println!(
        "4. forward:   duplicate returned {:?}",
        dup.return_value().await?
    );
    println!(
        "              owner got the duplicate's input: {:?}",
        first.return_value().await?
    );

    let order = format!("supersede-{suffix}");
    let first = owner(&rt, &order).await?;
    let newest = rt.start(newest_wins, (order.clone(),)).await?;
    let old = first
        .return_value()
        .await
        .expect_err("the old owner is cancelled");
    println!("5. supersede: old owner: {old}");
    // The newest run claims the token once the cancel released it.
    loop {
        match rt.get_hook_by_token(format!("order:{order}")).await {
            Ok(h) if h.run_id == newest.id() => break,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    rt.resume_hook(format!("order:{order}"), yes).await?;
    println!(
        "              newest run returned {:?}",
        newest.return_value().await?
    );
    Ok(())
}
