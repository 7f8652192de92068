//! What a rejected `#[workflow]`'s stand-in does if it is ever run. Its crate normally does not
//! compile (the macro reports the rejection); these calls exist only so that its callers
//! type-check. Written here by hand in the shape the macro emits.

use workflow_core::__private::{Rejected, WorkflowCall};
use workflow_core::prelude::*;

fn rejected(order_id: String) -> WorkflowCall<Rejected<(String,), u64>> {
    WorkflowCall::new((order_id,))
}

#[tokio::test]
async fn a_rejected_workflow_cannot_be_started() {
    let rt = Runtime::builder().in_memory().build().await.unwrap();
    let Err(error) = rt.start(rejected, ("o-1".to_string(),)).await else {
        panic!("a rejected workflow started");
    };
    assert!(error.to_string().contains("rejected this fn"), "{error}");
}

#[tokio::test]
async fn a_rejected_workflow_awaited_in_place_fails_without_running() {
    let error = rejected("o-1".to_string()).await.unwrap_err();
    assert!(error.is_fatal(), "{error}");
    assert!(error.to_string().contains("rejected this fn"), "{error}");
}
