use workflow_core::prelude::*;

#[workflow]
async fn first_reply(order_id: String) -> Result<String> {
    let reply = tokio::select! {
        reply = ask_customer(order_id.clone()) => reply?,
        _ = sleep(Duration::from_secs(3600)) => format!("{order_id}: no reply"),
    };
    Ok(reply)
}

#[step]
async fn ask_customer(order_id: String) -> Result<String> {
    Ok(order_id)
}

fn main() {}
