//! What a store keeps, as text, for the tests that look for a value that must not be there
//! in the clear.

use workflow_core::store::RunFilter;
use workflow_core::Runtime;

use super::{Backend, TestDb};

/// Everything the store keeps, as text: the SQLite files' raw bytes, a `pg_dump` of the
/// schema, or every record of every run the memory store hands out.
pub async fn stored_text(db: &TestDb, rt: &Runtime) -> String {
    match db.backend {
        Backend::Sqlite => {
            let mut all = Vec::new();
            for suffix in ["", "-wal"] {
                let mut path = db.sqlite_path().into_os_string();
                path.push(suffix);
                if let Ok(bytes) = std::fs::read(&path) {
                    all.extend(bytes);
                }
            }
            String::from_utf8_lossy(&all).into_owned()
        }
        Backend::Postgres => {
            let url = super::postgres_url().expect("checked by the test macro");
            let out = std::process::Command::new("pg_dump")
                .args(["--data-only", "--schema", &db.schema, "--dbname", &url])
                .output()
                .expect("pg_dump runs");
            assert!(
                out.status.success(),
                "pg_dump failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
        Backend::Memory => {
            let store = rt.store();
            let mut text = String::new();
            for run in store.list_runs(&RunFilter::new()).await.unwrap() {
                text.push_str(&format!("{run:?}\n"));
                let events = store.events(&run.id).await.unwrap();
                text.push_str(&format!("{events:?}\n"));
                let inbox = store.payloads(&run.id, 0).await.unwrap();
                text.push_str(&format!("{inbox:?}\n"));
                let chunks = store.read_stream(&run.id, "chunks", 0, 100).await.unwrap();
                text.push_str(&format!("{:?}\n", chunks.chunks));
                let published = store.run_events(&run.id).await.unwrap();
                text.push_str(&format!("{published:?}\n"));
                for r in store.run_requests(&run.id).await.unwrap() {
                    let reply = store.request_reply(&run.id, r.id).await.unwrap();
                    text.push_str(&format!("{r:?} {reply:?}\n"));
                }
            }
            text
        }
    }
}

/// The sealed text of a stored envelope as the crate writes it since version 5:
/// `"$wf_sealed:v4:<key id>:<base64>"` (`v4c` for a codec's bytes), or as version 4 wrote
/// it, `{"$wf_sealed": "v4:<key id>:<base64>"}`.
fn sealed_text(value: &serde_json::Value) -> Option<&str> {
    match value {
        serde_json::Value::String(s) => s.strip_prefix("$wf_sealed:"),
        other => other.get("$wf_sealed")?.as_str(),
    }
}

/// The key id a stored envelope names, read from its text (see [`sealed_text`]); `None` for
/// a value sealed in no such form.
pub fn sealed_key(value: &serde_json::Value) -> Option<&str> {
    let text = sealed_text(value)?;
    let (_, rest) = text.split_once(':')?;
    rest.rsplit_once(':').map(|(key, _)| key)
}

/// Whether a stored envelope holds a `Codec`'s bytes (form `v4c`).
pub fn sealed_coded(value: &serde_json::Value) -> bool {
    sealed_text(value).is_some_and(|text| text.starts_with("v4c:"))
}
