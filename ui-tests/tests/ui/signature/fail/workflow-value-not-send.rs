use std::rc::Rc;
use workflow_core::prelude::*;

// Serializable, but not `Send`: runs move between worker threads.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Session {
    id: String,
    #[serde(skip)]
    cache: Option<Rc<String>>,
}

#[workflow]
async fn refresh(session: Session) -> Result<Session> {
    Ok(session)
}

async fn client(rt: Runtime, session: Session) {
    // The start call itself type-checks: only the types are reported.
    let _ = rt.start(refresh, (session,)).await;
}

fn main() {
    let _ = client;
}
