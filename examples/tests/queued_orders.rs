//! The queued orders example: at most 10 payment calls at once, and each customer's orders
//! charged one at a time in the order they were started.

#[allow(dead_code)]
#[path = "../queued_orders.rs"]
mod queued_orders;

use workflow_core::Runtime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_keeps_the_payment_api_s_limits_and_each_customer_s_order() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .sqlite(dir.path().join("orders.db"))
        .queue(queued_orders::payments_queue())
        .build()
        .await
        .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(90),
        queued_orders::burst(&rt, 40, 8),
    )
    .await
    .expect("the burst finished in time")
    .unwrap();
    let most = queued_orders::most_in_flight();
    assert!((1..=10).contains(&most), "{most} payment calls at once");
    let charged = queued_orders::charged().lock().unwrap().clone();
    assert_eq!(charged.len(), 8);
    for (customer, orders) in charged {
        let mut sorted = orders.clone();
        sorted.sort();
        assert_eq!(orders, sorted, "{customer}'s orders in start order");
        assert_eq!(orders.len(), 5);
    }
}
