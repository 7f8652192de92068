//! Every error the API returns composes with `?` the way a user's `main` needs: into
//! `anyhow::Error` and into `Box<dyn std::error::Error + Send + Sync>`, message and chain of
//! causes kept, the original recoverable by downcasting. The runs themselves are in the
//! `Error` doctest (an `anyhow` main) and in ui-tests' `errors/pass` (a boxed-error main).

use std::error::Error as StdError;

use workflow_core::testing::ReplayError;
use workflow_core::{
    BuildError, DatabaseError, Elapsed, Error, HookConflictError, HookError, HookNotFoundError,
    KeyError, ParseRunIdError, PayloadTooLarge, RekeyError, ResumeHookError, RunError, RunId,
    ScheduleError, StartError, StoreError,
};

/// `?` into either target: what `main() -> anyhow::Result<()>` and
/// `main() -> Result<(), Box<dyn Error + Send + Sync>>` need of an error.
fn into_both<E: StdError + Send + Sync + 'static>(make: impl Fn() -> E) -> (String, String) {
    fn anyhow_main<E: StdError + Send + Sync + 'static>(e: E) -> anyhow::Result<()> {
        Err(e)?
    }
    fn boxed_main<E: StdError + Send + Sync + 'static>(
        e: E,
    ) -> Result<(), Box<dyn StdError + Send + Sync>> {
        Err(e)?
    }
    let a = anyhow_main(make()).unwrap_err();
    let b = boxed_main(make()).unwrap_err();
    assert!(a.downcast_ref::<E>().is_some());
    assert!(b.downcast_ref::<E>().is_some());
    (format!("{a:#}"), b.to_string())
}

#[test]
fn every_error_of_the_api_goes_into_anyhow_and_a_boxed_error() {
    let id = RunId::new();
    let token = || "t".to_owned();
    let texts = [
        into_both(|| Error::fatal("refused")),
        into_both(|| RunError::NotFound(id)),
        into_both(|| StartError::NoRuntime),
        into_both(|| StoreError::RunNotFound(id)),
        into_both(|| DatabaseError::new("down")),
        into_both(|| HookError::InvalidToken(token())),
        into_both(|| -> ResumeHookError { HookError::NoRuntime }),
        into_both(|| HookNotFoundError { token: token() }),
        into_both(|| HookConflictError {
            token: token(),
            conflicting_run_id: id,
        }),
        into_both(|| PayloadTooLarge {
            what: "the arguments".into(),
            size: 2,
            limit: 1,
        }),
        into_both(|| BuildError::Store(StoreError::database("gone"))),
        into_both(|| ScheduleError::NotFound { name: "n".into() }),
        into_both(|| RekeyError::NoKeys),
        into_both(|| -> KeyError { workflow_core::Keys::parse("nonsense").unwrap_err() }),
        into_both(|| -> ParseRunIdError { "x".parse::<RunId>().unwrap_err() }),
        into_both(|| ReplayError::Invalid("not a history".into())),
    ];
    // The message is the error's own, through either.
    for (through_anyhow, boxed) in &texts {
        assert!(!boxed.is_empty());
        assert!(
            through_anyhow.starts_with(boxed.as_str()),
            "{through_anyhow} / {boxed}"
        );
    }
    assert_eq!(texts[0].1, "refused");
    assert_eq!(texts[1].1, format!("run {id} not found"));
}

#[tokio::test]
async fn a_timeout_composes_too() {
    let elapsed: Elapsed =
        workflow_core::timeout(std::time::Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
    assert_eq!(into_both(move || elapsed).1, "deadline has elapsed");
}

#[test]
fn the_chain_of_causes_survives() {
    let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
    let store = StoreError::Database(DatabaseError::with_source("cannot read runs", io()));
    let e = anyhow::Error::from(store);
    assert_eq!(
        format!("{e:#}"),
        "database error: cannot read runs: reset by peer"
    );
    let causes: Vec<String> = e.chain().map(ToString::to_string).collect();
    assert_eq!(
        causes,
        ["database error: cannot read runs", "reset by peer"]
    );
    assert!(e.root_cause().downcast_ref::<std::io::Error>().is_some());

    // A run's `Error` is recorded: its causes are in its message.
    #[derive(Debug, thiserror::Error)]
    #[error("card declined")]
    struct Declined(#[source] std::io::Error);
    let recorded = Error::new(Declined(io()));
    assert_eq!(recorded.to_string(), "card declined: reset by peer");
    assert!(!recorded.is_fatal());
    let boxed: Box<dyn StdError + Send + Sync> = recorded.clone().into();
    assert_eq!(boxed.downcast_ref::<Error>(), Some(&recorded));
}

#[test]
fn an_error_passes_through_new_and_own_errors_convert() {
    let fatal = Error::fatal("refused");
    assert_eq!(Error::new(fatal.clone()), fatal);
    assert!(Error::new(fatal).is_fatal());

    // `?` outside a step: this crate's errors convert, retryable, a conflict keeps its kind.
    fn helper(id: RunId) -> workflow_core::Result<()> {
        Err(RunError::NotFound(id))?
    }
    let e = helper(RunId::new()).unwrap_err();
    assert!(!e.is_fatal() && e.to_string().ends_with("not found"));
    let conflict = HookConflictError {
        token: "t".into(),
        conflicting_run_id: RunId::new(),
    };
    assert_eq!(
        Error::from(conflict.clone()).as_hook_conflict(),
        Some(&conflict)
    );
}
