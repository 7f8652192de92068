//! The ledger example: 20 payment runs of 3 transactional transfers each keep the sum of the
//! balances and record each transfer once; a declined transfer leaves no trace of its debit.

#[allow(dead_code)]
#[path = "../ledger.rs"]
mod ledger;

use std::time::Duration;

use workflow_core::Runtime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_apply_once_and_keep_the_sum() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    ledger::open_accounts(&db, 5).unwrap();
    let rt = Runtime::builder().sqlite_shared(&db).build().await.unwrap();
    tokio::time::timeout(Duration::from_secs(90), ledger::run_payments(&rt, 5, 20))
        .await
        .expect("the payments finished in time")
        .unwrap();
    let (rows, transfers) = ledger::balances(&db).unwrap();
    assert_eq!(rows.iter().map(|(_, b)| b).sum::<i64>(), 5_000);
    assert_eq!(transfers, 60);
    // Each account paid 3 x 10 cents 4 times and was paid 10 cents 12 times.
    for (id, balance) in rows {
        assert_eq!(balance, 1_000 - 4 * 30 + 12 * 10, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_transfer_rolls_back_its_debit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let rt = Runtime::builder().sqlite(&db).build().await.unwrap();
    ledger::open_accounts(&db, 2).unwrap();
    let run = rt
        .start(
            ledger::payments,
            (ledger::account(0), vec![ledger::account(1)], 5_000),
        )
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), run.return_value())
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.message().contains("insufficient funds"), "{e}");
    let (rows, transfers) = ledger::balances(&db).unwrap();
    assert_eq!(
        rows,
        vec![(ledger::account(0), 1_000), (ledger::account(1), 1_000)]
    );
    assert_eq!(transfers, 0);
}
