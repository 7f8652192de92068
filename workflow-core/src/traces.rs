//! Traces that follow a run across workers, processes and restarts (SPEC 15, feature `otel`).
//!
//! A start opens a short `workflow.start` span, a child of the caller's current `tracing`
//! span, and keeps its W3C context with the run ([`crate::store::TraceContext`], one column).
//! Every step attempt, in whatever process drives it and after any number of restarts, opens
//! a `step` span whose OpenTelemetry parent is that stored context: one trace shows the whole
//! run, and no span a crash left unfinished is ever anyone's parent (the start span ended at
//! admission). Replayed steps run no attempt, so they open no span; waits (timers, hooks,
//! messages, children) are not spans at all.
//!
//! Without the feature these functions record nothing and set no parent: the `tracing` spans
//! stay what they are for logs.

use crate::ids::RunId;
use crate::model::TraceContext;

/// The span a start runs its admission in, and the context to keep with the run: the
/// span's own, as a child of `parent` (a child run's start, inside its parent's trace) or of
/// the caller's current span. `None` when no OpenTelemetry layer records the span (or without
/// the feature).
pub(crate) fn start_span(
    workflow: &str,
    run_id: RunId,
    parent: Option<&TraceContext>,
) -> (tracing::Span, Option<TraceContext>) {
    #[cfg(feature = "otel")]
    {
        let span = tracing::info_span!(
            "workflow.start",
            workflow.name = workflow,
            workflow.run_id = %run_id,
        );
        if let Some(parent) = parent {
            set_parent(&span, parent);
        }
        let cx = otel::context_of(&span);
        (span, cx)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (workflow, run_id, parent);
        (tracing::Span::none(), None)
    }
}

/// Makes `cx` the OpenTelemetry parent of `span`, which must not have been entered yet.
/// Nothing happens without the feature, without an OpenTelemetry layer, or for a context
/// that does not parse.
pub(crate) fn set_parent(span: &tracing::Span, cx: &TraceContext) {
    #[cfg(feature = "otel")]
    otel::set_parent(span, cx);
    #[cfg(not(feature = "otel"))]
    let _ = (span, cx);
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::model::TraceContext;

    /// The W3C context of `span` as the OpenTelemetry layer built it; `None` when no layer
    /// did (its context is invalid then).
    pub(super) fn context_of(span: &tracing::Span) -> Option<TraceContext> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        encode(&sc)
    }

    pub(super) fn set_parent(span: &tracing::Span, cx: &TraceContext) {
        if let Some(sc) = decode(cx) {
            // Fails only without a layer or once the span started: nothing to parent then.
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
        }
    }

    pub(super) fn encode(sc: &SpanContext) -> Option<TraceContext> {
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        Some(TraceContext {
            traceparent: format!(
                "00-{:032x}-{:016x}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            ),
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    pub(super) fn decode(cx: &TraceContext) -> Option<SpanContext> {
        let cx = TraceContext::parse(&cx.to_text())?;
        let mut fields = cx.traceparent.split('-').skip(1);
        let trace_id = TraceId::from_hex(fields.next()?).ok()?;
        let span_id = SpanId::from_hex(fields.next()?).ok()?;
        let flags = u8::from_str_radix(fields.next()?, 16).ok()?;
        let state = cx
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let sc = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
        sc.is_valid().then_some(sc)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_context_survives_the_column() {
            let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01,rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
            let cx = TraceContext::parse(text).unwrap();
            let sc = decode(&cx).unwrap();
            assert!(sc.is_sampled() && sc.is_remote());
            assert_eq!(
                format!("{:032x}", sc.trace_id()),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            assert_eq!(encode(&sc).unwrap().to_text(), text);
            let unsampled =
                TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                    .unwrap();
            let sc = decode(&unsampled).unwrap();
            assert!(!sc.is_sampled());
            assert_eq!(encode(&sc), Some(unsampled));
            assert!(encode(&SpanContext::empty_context()).is_none());
        }
    }
}
