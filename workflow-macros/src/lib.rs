//! `#[workflow]` and `#[step]`, the attribute macros behind `workflow_core`. Users depend on
//! `workflow_core`, which re-exports them; the generated code names only
//! `::workflow_core::__private` items.
//!
//! Each entry point hands its tokens to `expand`, which parses the options (`args`) and the
//! function (`parse`), validates both collecting every error (`errors`), and generates code. On
//! error the user's function is emitted unchanged next to the errors, so the IDE keeps working,
//! inside a stand-in of the same name that keeps its callers type-checking, so the errors are
//! the macro's only.

mod allow;
mod analyze;
mod args;
mod errors;
mod expand;
mod lift;
mod parse;
mod rules;
mod tx_body;

use proc_macro::TokenStream;

/// Makes an `async fn` a durable workflow; see `workflow_core` for the semantics.
/// Options: `name = ".."` pins the stable name (default: module path + fn name).
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::workflow(args.into(), item.into()).into()
}

/// Makes an `async fn` a recorded, retried step; see `workflow_core` for the semantics.
/// Options: `name = ".."` pins the stable name, `max_retries = N` (default 3),
/// `timeout = ".."`, each attempt's deadline, and `transactional`: the first parameter is
/// `tx: &mut Tx<'_>`, the store's transaction, in which the step's writes commit with its
/// recorded result (it is not an argument of the call).
///
/// Durations, here and in `workflow prune --older-than`, are written in jiff's friendly
/// format: numbers with units from largest to smallest, each unit once — `"500ms"`, `"30s"`,
/// `"5m"`, `"1h30m"`, `"1m 30s"`, `"2 hours"`, `"1.5h"`, `"1d"` (units `ms`, `s`, `m`, `h`,
/// `d`, `w`, or their names: `secs`, `minutes`, ...) — or in ISO 8601 (`"PT30S"`). A day is
/// 24 hours and a week 7 days; months and years, whose length depends on the date, and
/// negative durations are refused at compile time.
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::step(args.into(), item.into()).into()
}
