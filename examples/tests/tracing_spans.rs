//! The spans the runtime emits, as a subscriber sees them: one `workflow_run` per run and one
//! `step` per attempt, inside it, with the fields exporters need.

#[allow(dead_code)]
#[path = "../tracing_spans.rs"]
mod tracing_spans;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use workflow_core::Runtime;

#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        let parent = ctx.span(id).and_then(|s| s.parent().map(|p| p.name()));
        self.0.lock().unwrap().push(Seen {
            name: attrs.metadata().name(),
            fields: fields.0,
            parent,
        });
    }
}

// One thread: the subscriber set for this test sees every task the runtime spawns.
#[tokio::test(flavor = "current_thread")]
async fn runs_and_step_attempts_are_spans_with_their_fields() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let rt = Runtime::builder().in_memory().build().await.unwrap();
    let cents = tokio::time::timeout(Duration::from_secs(60), tracing_spans::run(&rt))
        .await
        .expect("the run did not finish in time")
        .unwrap();
    assert_eq!(cents, 10_800);

    let seen = capture.0.lock().unwrap().clone();
    let runs: Vec<&Seen> = seen.iter().filter(|s| s.name == "workflow_run").collect();
    assert_eq!(runs.len(), 1, "{seen:#?}");
    let run_id = runs[0].fields["workflow.run_id"].clone();
    assert!(
        runs[0].fields["workflow.name"].ends_with("::convert_invoice"),
        "{runs:?}"
    );

    let steps: Vec<(&str, &str)> = seen
        .iter()
        .filter(|s| s.name == "step")
        .map(|s| {
            assert_eq!(s.parent, Some("workflow_run"), "{s:?}");
            assert_eq!(s.fields["workflow.run_id"], run_id, "{s:?}");
            assert!(
                s.fields["workflow.name"].ends_with("::convert_invoice"),
                "{s:?}"
            );
            assert!(s.fields["step.id"].starts_with("stp_"), "{s:?}");
            let step = s.fields["step.name"].rsplit("::").next().unwrap();
            (step, s.fields["step.attempt"].as_str())
        })
        .collect();
    assert_eq!(
        steps,
        [("fetch_rate", "1"), ("fetch_rate", "2"), ("convert", "1")]
    );
}
