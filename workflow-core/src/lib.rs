// The README is the crate's front page, so its example is a doctest. Its links point at the
// repository's files; the definitions below come first, so they win in rustdoc and send the
// guide's links to the `guide` modules instead.
#![doc = "[guide-steps]: crate::guide::steps"]
#![doc = "[guide-hooks]: crate::guide::hooks"]
#![doc = "[guide-determinism]: crate::guide::determinism"]
#![doc = "[guide-queues]: crate::guide::queues"]
#![doc = "[guide-children]: crate::guide::children"]
#![doc = "[guide-deploys]: crate::guide::deploys"]
#![doc = "[guide-streams]: crate::guide::streams"]
#![doc = "[guide-schedules]: crate::guide::schedules"]
#![doc = "[guide-messages]: crate::guide::messages"]
#![doc = "[guide-transactional]: crate::guide::transactional"]
#![doc = "[guide-continue-as-new]: crate::guide::continue_as_new"]
#![doc = "[guide-encryption]: crate::guide::encryption"]
#![doc = "[guide-observability]: crate::guide::observability"]
#![doc = "[guide-stores]: crate::guide::stores"]
#![doc = "[guide-testing]: crate::guide::testing"]
#![doc = "[guide-cli]: crate::guide::cli"]
#![doc = include_str!("../README.md")]

/// The guide's link labels as rustdoc links, put before each page of `guide` (see there).
macro_rules! links {
    () => {
        "[guide-steps]: crate::guide::steps\n\
         [guide-hooks]: crate::guide::hooks\n\
         [guide-determinism]: crate::guide::determinism\n\
         [guide-queues]: crate::guide::queues\n\
         [guide-children]: crate::guide::children\n\
         [guide-deploys]: crate::guide::deploys\n\
         [guide-streams]: crate::guide::streams\n\
         [guide-schedules]: crate::guide::schedules\n\
         [guide-messages]: crate::guide::messages\n\
         [guide-transactional]: crate::guide::transactional\n\
         [guide-continue-as-new]: crate::guide::continue_as_new\n\
         [guide-encryption]: crate::guide::encryption\n\
         [guide-observability]: crate::guide::observability\n\
         [guide-stores]: crate::guide::stores\n\
         [guide-testing]: crate::guide::testing\n\
         [guide-cli]: crate::guide::cli\n"
    };
}

pub mod api;
mod child;
mod config;
mod context;
mod continuation;
mod crypto;
mod divergence;
mod driver;
pub mod error;
mod event;
pub mod guide;
mod history;
mod ids;
mod message;
mod model;
mod payload;
mod queue;
mod registry;
mod replay;
mod request;
mod runtime;
mod schedule;
pub mod store;
mod sync;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod traces;
mod transactional;

pub use child::{start_child, Child, StartChild};
pub use context::{
    continue_as_new_suggested, create_generated_hook, create_hook, now, patched, random, sleep,
    sleep_until, step_metadata, try_step_metadata, try_workflow_metadata, workflow_metadata, Hook,
    HookConflict, StepMetadata, WorkflowMetadata,
};
pub use continuation::{continue_as_new, ContinueAsNew};
pub use crypto::{Codec, KeyError, Keys, PayloadContext};
pub use divergence::{Divergence, DivergenceKind};
pub use error::{
    BuildError, DatabaseError, Error, ErrorKind, HookConflictError, HookError, HookNotFoundError,
    PayloadTooLarge, ResumeHookError, RunError, StartError, StoreError,
};
pub use event::set_event;
pub use history::{
    ExportedEvent, ExportedHistory, ExportedRun, HISTORY_FORMAT, HISTORY_FORMAT_VERSION,
};
pub use ids::{ParseRunIdError, RunId};
pub use message::{recv, timeout, Elapsed, Recv};
pub use queue::Queue;
pub use registry::{IntoWorkflow, WorkflowCall, WorkflowDef};
pub use request::{requests, NextRequest, Request, Requests};
pub use runtime::{
    stream, Chunk, EventRead, HookInfo, HookRef, LatestEvent, OrResume, RekeyCount, RekeyError,
    RekeyOptions, RekeyReport, Run, RunStream, Runtime, RuntimeBuilder, SendMessage, SendRequest,
    Start, StartOrResume, StreamWriter,
};
pub use schedule::{Schedule, ScheduleError, ScheduleInfo, ScheduleTick};
pub use store::{
    CatchUp, Overlap, PruneStats, RunFilter, RunRecord, RunStatus, ScheduleSpec, SkipReason,
    StreamInfo, TickOutcome, TickRecord,
};
pub use transactional::Tx;
pub use workflow_macros::{step, workflow};

/// The SQLite driver the store uses, so that transactional steps (`tx.sqlite(..)`) name the
/// very version the store was built with.
#[cfg(feature = "sqlite")]
pub use rusqlite;
/// The PostgreSQL driver the store uses, so that transactional steps (`tx.postgres()`) name
/// the very version the store was built with.
#[cfg(feature = "postgres")]
pub use sqlx;

/// `Result<T, workflow_core::Error>`; the default parameter keeps two-argument `Result<T, E>`
/// working under the prelude.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a workflow author needs: `use workflow_core::prelude::*;`.
pub mod prelude {
    pub use crate::continue_as_new_suggested;
    pub use crate::{
        continue_as_new, create_generated_hook, create_hook, now, patched, random, sleep,
        sleep_until, start_child, step, step_metadata, stream, workflow, workflow_metadata, Child,
        Chunk, Divergence, Error, Hook, HookConflict, HookConflictError, HookError, HookRef, Keys,
        Queue, Result, Run, RunError, RunFilter, RunId, RunRecord, RunStatus, RunStream, Runtime,
        StartError, StartOrResume, StepMetadata, Tx, WorkflowMetadata,
    };
    pub use crate::{recv, requests, set_event, timeout, Elapsed, Recv, Request, Requests};
    pub use crate::{CatchUp, Overlap, Schedule, ScheduleTick};
    pub use std::time::Duration;
    // The store's capabilities, by method only: `rt.store().get_run(..)` needs no import.
    pub use crate::store::{
        AdminStore as _, HookStore as _, MessageStore as _, QueueStore as _, RekeyStore as _,
        RunStore as _, ScheduleStore as _, StreamStore as _, TransactionalStore as _,
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::context::{call_step, call_tx_step};
    pub use crate::registry::{
        BoxFuture, StepDef, StepRegistration, WorkflowCall, WorkflowDef, WorkflowRegistration,
        WorkflowReturn, WorkflowValue,
    };
    pub use crate::transactional::transactional;
    pub use inventory;
    pub use serde_json;

    use std::future::Future;
    use std::marker::PhantomData;

    use crate::Error;

    /// Compile-time check that `T` can be recorded; spanned at the user's type by the macros.
    pub fn assert_value<T: WorkflowValue>() {}

    /// What `?` converts inside a `#[step]` or `#[workflow]` body, whose macro rewrites each
    /// `expr?` of the body's own (not of its closures, async blocks or nested fns) as
    /// `lift(expr)?`: [`Error`] itself cannot convert from every std error with `From`, since
    /// it is one (that impl would overlap `From<T> for T`).
    #[diagnostic::on_unimplemented(
        message = "`?` cannot convert `{Self}` into a `workflow_core::Error`",
        label = "`{Self}` is not a `std::error::Error + Send + Sync + 'static`",
        note = "`?` in a step or workflow converts any `std::error::Error + Send + Sync + 'static` into a retryable `workflow_core::Error`; convert other errors yourself, e.g. `.map_err(|e| Error::retryable(e.to_string()))?`"
    )]
    pub trait IntoError {
        /// [`Error::new`].
        fn into_error(self) -> Error;
    }

    impl<E: std::error::Error + Send + Sync + 'static> IntoError for E {
        fn into_error(self) -> Error {
            Error::new(self)
        }
    }

    /// `r` with its error converted by [`Error::new`] (an [`Error`] stays as it is).
    #[inline]
    pub fn lift<T, E: IntoError>(r: Result<T, E>) -> Result<T, Error> {
        match r {
            Ok(value) => Ok(value),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Converts between a `#[workflow]`/`#[step]` fn's declared return type `R` and
    /// `Result<R::Ok, Error>`: `(&ReturnOf::<R>::new()).result_of(r)` resolves to
    /// [`RecordedReturn`] when `R: WorkflowReturn`, and otherwise to [`UnrecordedReturn`], so a
    /// wrong return type (`Result<T, String>`, `anyhow::Result<T>`) is reported once, at the
    /// return type, by the macro's `<R as WorkflowReturn>::Ok`.
    pub struct ReturnOf<R>(PhantomData<fn() -> R>);

    impl<R> ReturnOf<R> {
        /// The selector.
        pub const fn new() -> Self {
            ReturnOf(PhantomData)
        }
    }

    impl<R> Default for ReturnOf<R> {
        fn default() -> Self {
            Self::new()
        }
    }

    /// The real conversions.
    pub trait RecordedReturn<R: WorkflowReturn> {
        /// The identity on `Result<T, Error>`.
        fn result_of(&self, value: R) -> Result<R::Ok, Error>;
        /// The identity on `Result<T, Error>`.
        fn declared(&self, result: Result<R::Ok, Error>) -> R;
    }

    impl<R: WorkflowReturn> RecordedReturn<R> for ReturnOf<R> {
        fn result_of(&self, value: R) -> Result<R::Ok, Error> {
            value.into_result()
        }

        fn declared(&self, result: Result<R::Ok, Error>) -> R {
            R::from_result(result)
        }
    }

    /// The stand-ins for a return type that is not `workflow_core::Result<T>`, which the macro
    /// has already reported: the crate does not compile, so these never run.
    pub trait UnrecordedReturn<R> {
        /// Never called at run time.
        fn result_of<T>(&self, value: R) -> Result<T, Error>;
        /// Never called at run time.
        fn declared<T>(&self, result: Result<T, Error>) -> R;
    }

    impl<R> UnrecordedReturn<R> for &ReturnOf<R> {
        fn result_of<T>(&self, value: R) -> Result<T, Error> {
            let _ = value;
            unreachable!(
                "the return type is not `workflow_core::Result<T>`, so this cannot have compiled"
            )
        }

        fn declared<T>(&self, result: Result<T, Error>) -> R {
            let _ = result;
            unreachable!(
                "the return type is not `workflow_core::Result<T>`, so this cannot have compiled"
            )
        }
    }

    /// How a `#[workflow]`'s generated `WorkflowDef` methods serialize its arguments and result:
    /// `(&ValueOf::<T>::new()).encode(value)` resolves to [`RecordedValue`] when `T` can be
    /// recorded, and otherwise to [`UnrecordableValue`], which has no bounds. An unserializable
    /// type is thus reported once, at its span, by the macro's [`assert_value`], and not by the
    /// generated impl (which `rt.start(wf, args)` calls need, so its errors would repeat).
    pub struct ValueOf<T>(PhantomData<fn() -> T>);

    impl<T> ValueOf<T> {
        /// The selector.
        pub const fn new() -> Self {
            ValueOf(PhantomData)
        }
    }

    impl<T> Default for ValueOf<T> {
        fn default() -> Self {
            Self::new()
        }
    }

    /// The real conversions.
    pub trait RecordedValue<T> {
        /// The serialization every payload goes through.
        fn encode(&self, value: &T) -> Result<serde_json::Value, serde_json::Error>;
        /// Its reverse.
        fn decode(&self, value: serde_json::Value) -> Result<T, serde_json::Error>;
    }

    impl<T: WorkflowValue> RecordedValue<T> for ValueOf<T> {
        fn encode(&self, value: &T) -> Result<serde_json::Value, serde_json::Error> {
            crate::payload::to_json(value)
        }

        fn decode(&self, value: serde_json::Value) -> Result<T, serde_json::Error> {
            crate::payload::from_json(value)
        }
    }

    /// The stand-ins for a type that cannot be recorded, which the macro's `assert_value` has
    /// already reported: the crate does not compile, so these never run.
    pub trait UnrecordableValue<T> {
        /// Never called at run time.
        fn encode(&self, value: &T) -> Result<serde_json::Value, serde_json::Error>;
        /// Never called at run time.
        fn decode(&self, value: serde_json::Value) -> Result<T, serde_json::Error>;
    }

    impl<T> UnrecordableValue<T> for &ValueOf<T> {
        fn encode(&self, value: &T) -> Result<serde_json::Value, serde_json::Error> {
            let _ = value;
            unreachable!(
                "a workflow argument or result cannot be recorded, so this cannot have compiled"
            )
        }

        fn decode(&self, value: serde_json::Value) -> Result<T, serde_json::Error> {
            let _ = value;
            unreachable!(
                "a workflow argument or result cannot be recorded, so this cannot have compiled"
            )
        }
    }

    /// The definition behind the stand-in that `#[workflow]` emits for a function it rejected
    /// (a bad signature or option, or a body that does not parse), so that `rt.start(wf, args)`
    /// and `wf(args).await` elsewhere still type-check and the user sees the macro's one error,
    /// not a second one at each use. `A` is the argument tuple and `T` the result, as declared
    /// where they can be named, inferred from the call otherwise.
    ///
    /// It cannot run: it is never registered (the macro emits no `inventory::submit!` for it),
    /// so no worker executes it, and every method fails with an error instead of running
    /// anything. Normally the crate does not even compile, as the macro reports an error next to
    /// it; the one exception is a body that syn cannot parse but rustc can (syntax newer than
    /// syn), where `rt.start` then fails with that explanation.
    pub struct Rejected<A, T>(PhantomData<fn() -> (A, T)>);

    /// Why a [`Rejected`] workflow fails at run time.
    const REJECTED: &str =
        "`#[workflow]` rejected this fn when it was compiled, so it is not registered and cannot run";

    impl<A: 'static, T: 'static> WorkflowDef for Rejected<A, T> {
        const NAME: &'static str = "<rejected #[workflow]>";
        type Args = A;
        type Output = T;

        fn call(args: A) -> BoxFuture<'static, Result<T, Error>> {
            let _ = args;
            Box::pin(async { Err(Error::fatal(REJECTED)) })
        }

        fn encode_args(args: &A) -> Result<serde_json::Value, serde_json::Error> {
            let _ = args;
            Err(serde::ser::Error::custom(REJECTED))
        }

        fn decode_args(input: serde_json::Value) -> Result<A, serde_json::Error> {
            let _ = input;
            Err(serde::de::Error::custom(REJECTED))
        }

        fn encode_output(output: &T) -> Result<serde_json::Value, serde_json::Error> {
            let _ = output;
            Err(serde::ser::Error::custom(REJECTED))
        }
    }

    /// How a `#[step]` fn reaches [`call_step`]: `(&StepCall::<Args, T>::new()).call_step(..)`
    /// resolves to [`RecordedStep`] when `Args` and `T` can be recorded, and otherwise to
    /// [`UnrecordableStep`], which has no bounds. An unserializable type is thus reported once,
    /// by the macro's spanned [`assert_value`], instead of a second time at the attribute by
    /// `call_step`'s bounds. (Method resolution tries `StepCall` before `&StepCall`, and takes
    /// an impl only if its bounds hold, since all types here are concrete.)
    pub struct StepCall<A, T>(PhantomData<fn() -> (A, T)>);

    impl<A, T> StepCall<A, T> {
        /// The selector.
        pub const fn new() -> Self {
            StepCall(PhantomData)
        }
    }

    impl<A, T> Default for StepCall<A, T> {
        fn default() -> Self {
            Self::new()
        }
    }

    /// The real call: records the step.
    pub trait RecordedStep<A, T> {
        /// [`call_step`].
        fn call_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static;
        /// [`call_tx_step`], for `#[step(transactional)]`.
        fn call_tx_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static;
    }

    impl<A: WorkflowValue, T: WorkflowValue> RecordedStep<A, T> for StepCall<A, T> {
        fn call_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static,
        {
            call_step(def, args, body)
        }

        fn call_tx_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static,
        {
            call_tx_step(def, args, body)
        }
    }

    /// The stand-in chosen only when an argument or the result cannot be recorded, which the
    /// macro's `assert_value` has already reported: the crate does not compile, so this never
    /// runs.
    pub trait UnrecordableStep<A, T> {
        /// Never called at run time.
        fn call_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static;

        /// Never called at run time.
        fn call_tx_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static,
        {
            self.call_step(def, args, body)
        }
    }

    impl<A, T> UnrecordableStep<A, T> for &StepCall<A, T> {
        fn call_step<F, Fut>(
            &self,
            def: &'static StepDef,
            args: A,
            body: F,
        ) -> impl Future<Output = Result<T, Error>> + Send
        where
            F: Fn(A) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<T, Error>> + Send + 'static,
        {
            let _ = (args, body);
            async move {
                unreachable!(
                    "step `{}` has an argument or result that cannot be recorded, so it \
                     cannot have compiled",
                    def.name
                )
            }
        }
    }
}
