//! The client calls as free functions, using the current runtime: inside a step, the runtime
//! executing it; elsewhere, the most recently built runtime in the process. This is how a step
//! acts on another run.

use serde_json::Value;

use crate::error::{Error, StartError};
use crate::ids::RunId;
use crate::registry::{IntoWorkflow, WorkflowDef};
use crate::runtime::{current_runtime, Run, Runtime, Start};

fn runtime() -> Result<Runtime, Error> {
    current_runtime().ok_or_else(|| {
        Error::fatal("no workflow runtime has been built in this process; build one with `Runtime::builder()...build().await`")
    })
}

/// [`Runtime::start`] on the current runtime.
pub fn start<F, Args>(
    workflow: F,
    args: Args,
) -> Result<Start<<F as IntoWorkflow<Args>>::Def>, StartError>
where
    F: IntoWorkflow<Args>,
    <F as IntoWorkflow<Args>>::Def: WorkflowDef,
{
    let rt = current_runtime().ok_or_else(|| {
        StartError::UnknownWorkflow(
            "(no workflow runtime has been built in this process)".to_owned(),
        )
    })?;
    Ok(rt.start(workflow, args))
}

/// [`Runtime::get_run`] on the current runtime.
pub fn get_run(id: &RunId) -> Result<Run<Value>, Error> {
    Ok(runtime()?.get_run(id))
}
