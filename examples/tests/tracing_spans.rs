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

/// The spans `capture` saw while `subscriber`, which holds it, was this thread's default
/// during one invoice conversion on a fresh in-memory runtime. The tests run on one thread,
/// so the subscriber sees every task the runtime spawns.
async fn seen_in_one_run(
    capture: &Capture,
    subscriber: impl Subscriber + Send + Sync + 'static,
) -> Vec<Seen> {
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = Runtime::builder().in_memory().build().await.unwrap();
    let cents = tokio::time::timeout(Duration::from_secs(60), tracing_spans::run(&rt))
        .await
        .expect("the run did not finish in time")
        .unwrap();
    assert_eq!(cents, 10_800);
    rt.shutdown();
    let seen = capture.0.lock().unwrap().clone();
    seen
}

#[tokio::test(flavor = "current_thread")]
async fn runs_and_step_attempts_are_spans_with_their_fields() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let seen = seen_in_one_run(&capture, subscriber).await;
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

// At INFO, the level services run at, a run's spans are its step attempts' alone: the run's
// own span is DEBUG, under a target of its own that can be enabled by itself.
#[tokio::test(flavor = "current_thread")]
async fn at_info_a_run_records_only_its_step_attempts_unless_its_target_is_enabled() {
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    use workflow_core::telemetry::RUN_SPAN_TARGET;

    for run_span in [false, true] {
        let capture = Capture::default();
        let mut filter = Targets::new().with_default(Level::INFO);
        if run_span {
            filter = filter.with_target(RUN_SPAN_TARGET, Level::DEBUG);
        }
        let subscriber = tracing_subscriber::registry().with(capture.clone().with_filter(filter));
        let seen = seen_in_one_run(&capture, subscriber).await;
        let names: Vec<&str> = seen.iter().map(|s| s.name).collect();
        let steps = names.iter().filter(|n| **n == "step").count();
        assert_eq!(steps, 3, "{seen:#?}");
        let runs = names.iter().filter(|n| **n == "workflow_run").count();
        assert_eq!(runs, usize::from(run_span), "{seen:#?}");
        // The steps' spans are inside the run's when it is recorded, roots otherwise.
        let parent = run_span.then_some("workflow_run");
        for s in seen.iter().filter(|s| s.name == "step") {
            assert_eq!(s.parent, parent, "{s:?}");
        }
        // Nothing else of the runtime's at INFO (the example's own log lines are events) but,
        // with workflow-core's feature `otel`, the start's span, the parent of its trace.
        let starts = names.iter().filter(|n| **n == "workflow.start").count();
        assert!(starts <= 1, "{seen:#?}");
        assert_eq!(names.len(), starts + steps + runs, "{seen:#?}");
    }
}
