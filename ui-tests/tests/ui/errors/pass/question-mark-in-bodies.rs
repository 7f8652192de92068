#![deny(warnings)]
//! `?` inside a step or workflow converts any `std::error::Error + Send + Sync + 'static` (the
//! standard library's, a crate's own) into a retryable `workflow_core::Error`, and passes an
//! `Error` through with its kind; the crate's own errors convert in a helper fn too. The
//! program runs: the errors come out as converted.

use std::fmt;

use workflow_core::prelude::*;

#[derive(Debug)]
struct Declined {
    code: u16,
    cause: std::io::Error,
}

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "card declined ({})", self.code)
    }
}

impl std::error::Error for Declined {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

fn charge_card(cents: u64) -> std::result::Result<u64, Declined> {
    if cents > 100 {
        return Err(Declined {
            code: 51,
            cause: std::io::Error::other("insufficient funds"),
        });
    }
    Ok(cents)
}

#[step(max_retries = 0)]
async fn charge(amount: String) -> Result<u64> {
    let cents: u64 = amount.parse()?;
    let kept = format!("{}", charge_card(cents)?);
    Ok(kept.parse::<u64>()?)
}

#[step]
async fn refuse() -> Result<()> {
    Err(Error::fatal("refused"))?;
    Ok(())
}

/// Not a step: `?` converts only `Error` and this crate's own errors here.
async fn first_failed(rt: &Runtime) -> Result<Option<RunId>> {
    let runs = rt.runs(RunFilter::new().status(RunStatus::Failed)).await?;
    Ok(runs.first().map(|r| r.id))
}

#[workflow]
async fn pay(amount: String) -> Result<u64> {
    if amount.is_empty() {
        refuse().await?;
    }
    let cents = charge(amount).await?;
    Ok(cents)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rt = Runtime::builder().in_memory().build().await?;
    assert_eq!(rt.start(pay, ("42".to_string(),)).await?.return_value().await?, 42);

    let e = rt.start(pay, ("x".to_string(),)).await?.return_value().await.unwrap_err();
    assert_eq!(e.to_string(), "invalid digit found in string");
    assert!(!e.is_fatal());

    let e = rt.start(pay, ("500".to_string(),)).await?.return_value().await.unwrap_err();
    assert_eq!(e.to_string(), "card declined (51): insufficient funds");

    let e = rt.start(pay, (String::new(),)).await?.return_value().await.unwrap_err();
    assert!(e.is_fatal(), "{e:?}");

    assert!(first_failed(&rt).await?.is_some());
    // And into a boxed error, as `main` returns it.
    let boxed: Box<dyn std::error::Error + Send + Sync> = e.into();
    assert_eq!(boxed.to_string(), "refused");
    Ok(())
}
