//! The client calls as free functions, using the current runtime: inside a step, the runtime
//! executing it; elsewhere, the most recently built runtime in the process that its user still
//! holds a handle on. This is how a step acts on another run.

use serde_json::Value;

use crate::error::{Error, HookError, RunError, StartError, NO_RUNTIME};
use crate::ids::RunId;
use crate::registry::{IntoWorkflow, WorkflowDef};
use crate::runtime::{current_runtime, HookInfo, HookRef, Run, Runtime, Start};

fn runtime() -> Result<Runtime, Error> {
    current_runtime().ok_or_else(|| Error::fatal(NO_RUNTIME))
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
    let rt = current_runtime().ok_or(StartError::NoRuntime)?;
    Ok(rt.start(workflow, args))
}

/// [`Runtime::get_run`] on the current runtime.
pub fn get_run(id: &RunId) -> Result<Run<Value>, Error> {
    Ok(runtime()?.get_run(id))
}

/// [`Runtime::resume_hook`] on the current runtime (e.g. a step forwarding a payload to the
/// run that owns a token).
pub async fn resume_hook<P: serde::Serialize>(
    token: impl Into<String>,
    payload: P,
) -> Result<HookRef, HookError> {
    let rt = current_runtime().ok_or(HookError::NoRuntime)?;
    rt.resume_hook(token, payload).await
}

/// [`Runtime::get_hook_by_token`] on the current runtime.
pub async fn get_hook_by_token(token: impl AsRef<str>) -> Result<HookInfo, HookError> {
    let rt = current_runtime().ok_or(HookError::NoRuntime)?;
    rt.get_hook_by_token(token).await
}

/// [`Run::send`] on the current runtime: sends `msg` to run `run` on `topic` (e.g. a step
/// telling another run something). Await the returned builder, which takes
/// `.idempotency_key(k)`; a step's id ([`step_metadata`](crate::step_metadata)) makes a good
/// key, so the step's retries send the message once.
pub fn send<M: serde::Serialize>(
    run: &RunId,
    topic: impl Into<String>,
    msg: M,
) -> Result<crate::runtime::SendMessage, RunError> {
    let rt = current_runtime().ok_or_else(|| RunError::InvalidMessage(NO_RUNTIME.to_owned()))?;
    Ok(rt.get_run(run).send(topic, msg))
}

/// [`Run::request`] on the current runtime: sends `req` to run `run` under `name` and waits
/// for its reply. Await the returned builder, which takes `.idempotency_key(k)` (a step's id
/// makes a good key: a retried step waits for the same request's reply) and `.timeout(d)`.
pub fn request<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
    run: &RunId,
    name: impl Into<String>,
    req: Req,
) -> Result<crate::runtime::SendRequest<Resp>, RunError> {
    let rt = current_runtime().ok_or_else(|| RunError::InvalidMessage(NO_RUNTIME.to_owned()))?;
    Ok(rt.get_run(run).request(name, req))
}
