//! Traces that follow a run across workers, processes and restarts (feature `otel`).
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

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use crate::ids::RunId;
use crate::model::TraceContext;

pin_project_lite::pin_project! {
    /// `fut` polled inside `span`, as `tracing::Instrument` does, except that a future that
    /// finished is not entered again to be dropped: `Instrumented` enters its span on drop
    /// too, which with an OpenTelemetry layer (its context attached and timings kept on every
    /// enter) costs as much as a poll, once per admission, drive and step attempt. A future
    /// dropped before it finished (an aborted attempt, an evicted run) is still dropped inside
    /// the span.
    pub(crate) struct InSpan<F> {
        span: tracing::Span,
        // `None` once it finished.
        #[pin]
        fut: Option<F>,
    }

    impl<F> PinnedDrop for InSpan<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.fut.is_some() {
                let _entered = this.span.enter();
                this.fut.set(None);
            }
        }
    }
}

impl<F> InSpan<F> {
    pub(crate) fn new(span: tracing::Span, fut: F) -> Self {
        InSpan {
            span,
            fut: Some(fut),
        }
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let fut = this
            .fut
            .as_mut()
            .as_pin_mut()
            .expect("`InSpan` polled after it finished");
        let out = ready!(fut.poll(cx));
        // Dropped here, still inside the span, so that dropping `self` need not enter it.
        this.fut.set(None);
        Poll::Ready(out)
    }
}

/// `fut`, with `span` kept open until it finishes (or is dropped) but never entered: what a
/// start's admission runs as. The start span's only work is to be the parent of the run's
/// spans (its context is read once, at its creation); entering it at every poll of the
/// admission would cost, with an OpenTelemetry layer, a context attached and detached and two
/// clock reads per poll, for no span or log line that needs it.
pub(crate) async fn lasting<F: Future>(span: tracing::Span, fut: F) -> F::Output {
    let out = fut.await;
    drop(span);
    out
}

/// The OpenTelemetry parent of a run's spans: the context its start kept, decoded once per
/// drive rather than re-read from its text for every span (a run span and one span per step
/// attempt). Holds nothing without the feature, or for a context that does not parse.
#[derive(Clone, Default)]
pub(crate) struct Parent {
    #[cfg(feature = "otel")]
    cx: Option<opentelemetry::Context>,
}

impl Parent {
    /// The parent a run started in `stored` gives its spans.
    pub(crate) fn of(stored: Option<&TraceContext>) -> Parent {
        #[cfg(feature = "otel")]
        {
            Parent {
                cx: stored.and_then(otel::remote),
            }
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = stored;
            Parent {}
        }
    }

    /// Makes this the OpenTelemetry parent of `span`, which must not have been entered yet.
    /// Nothing happens without the feature, without a context, or for a span no
    /// OpenTelemetry layer records.
    pub(crate) fn adopt(&self, span: &tracing::Span) {
        #[cfg(feature = "otel")]
        if let Some(cx) = &self.cx {
            if !span.is_disabled() {
                use tracing_opentelemetry::OpenTelemetrySpanExt;
                // Fails only without a layer or once the span started: nothing to parent then.
                let _ = span.set_parent(cx.clone());
            }
        }
        #[cfg(not(feature = "otel"))]
        let _ = span;
    }
}

/// The span a start runs its admission in, and the context to keep with the run: the
/// span's own, as a child of `parent` (a child run's start, inside its parent's trace) or of
/// the caller's current span. `None` when no OpenTelemetry layer records the span (or without
/// the feature).
pub(crate) fn start_span(
    workflow: &str,
    run_id: RunId,
    parent: Option<&Parent>,
) -> (tracing::Span, Option<TraceContext>) {
    #[cfg(feature = "otel")]
    {
        let span = tracing::info_span!(
            "workflow.start",
            workflow.name = workflow,
            workflow.run_id = %run_id,
        );
        // No subscriber wants the span: no context to read from it either.
        if span.is_disabled() {
            return (span, None);
        }
        if let Some(parent) = parent {
            parent.adopt(&span);
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

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::model::{traceparent_fields, TraceContext};

    /// The W3C context of `span` as the OpenTelemetry layer built it; `None` when no layer
    /// did (its context is invalid then).
    pub(super) fn context_of(span: &tracing::Span) -> Option<TraceContext> {
        let cx = span.context();
        encode(cx.span().span_context())
    }

    /// The context a span continues when `stored` is its remote parent.
    pub(super) fn remote(stored: &TraceContext) -> Option<opentelemetry::Context> {
        let sc = decode(stored)?;
        Some(opentelemetry::Context::new().with_remote_span_context(sc))
    }

    pub(super) fn encode(sc: &SpanContext) -> Option<TraceContext> {
        if !sc.is_valid() {
            return None;
        }
        // `00-` 32 hex digits `-` 16 `-` 2, written by hand: `format!`'s padded hex costs
        // about ten times as much, once per start.
        let mut traceparent = String::with_capacity(55);
        traceparent.push_str("00-");
        push_hex(&mut traceparent, &sc.trace_id().to_bytes());
        traceparent.push('-');
        push_hex(&mut traceparent, &sc.span_id().to_bytes());
        traceparent.push('-');
        push_hex(&mut traceparent, &[sc.trace_flags().to_u8()]);
        let state = sc.trace_state().header();
        Some(TraceContext {
            traceparent,
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    fn push_hex(out: &mut String, bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for b in bytes {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 0xf)] as char);
        }
    }

    /// `N` bytes from `2 * N` hex digits (either case); `None` for any other text. Once per
    /// drive of a run, with `traceparent_fields` about half of what splitting the text and
    /// `from_hex` of the ids (through `u128::from_str_radix`) cost under callgrind.
    fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
        let digits = text.as_bytes();
        if digits.len() != 2 * N {
            return None;
        }
        let nibble = |d: u8| char::from(d).to_digit(16).map(|v| v as u8);
        let mut out = [0u8; N];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(out)
    }

    /// The span context `cx` holds, checked as [`TraceContext::parse`] checks a column's text.
    pub(super) fn decode(cx: &TraceContext) -> Option<SpanContext> {
        let [_, trace_id, span_id, flags] = traceparent_fields(cx.traceparent.trim())?;
        let trace_id = TraceId::from_bytes(hex_bytes(trace_id)?);
        let span_id = SpanId::from_bytes(hex_bytes(span_id)?);
        let [flags] = hex_bytes(flags)?;
        let state = cx
            .tracestate
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
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
            // A column's text is checked as `TraceContext::parse` checks it.
            for bad in [
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "00-4bf92f35-00f067aa0ba902b7-01",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            ] {
                let cx = TraceContext {
                    traceparent: bad.to_owned(),
                    tracestate: None,
                };
                assert!(decode(&cx).is_none(), "{bad}");
                assert!(TraceContext::parse(bad).is_none(), "{bad}");
            }
            // Either case, and a later version's fields after the flags, decode the same.
            let upper = TraceContext {
                traceparent: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01-later"
                    .to_owned(),
                tracestate: None,
            };
            let sc = decode(&upper).unwrap();
            assert_eq!(
                sc.trace_id(),
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
            );
            assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
            assert!(sc.is_sampled());
            assert_eq!(hex_bytes::<2>("0aFf"), Some([0x0a, 0xff]));
            for bad in ["0aF", "0aFfe", "0g00", "é0"] {
                assert_eq!(hex_bytes::<2>(bad), None, "{bad}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use futures::FutureExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::InSpan;

    /// Counts the enters of every span.
    struct Enters(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Enters {
        fn on_enter(&self, _: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Keeps the name of the span current where it is dropped.
    struct Probe(Arc<Mutex<Option<&'static str>>>);

    impl Drop for Probe {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = tracing::Span::current().metadata().map(|m| m.name());
        }
    }

    #[test]
    fn a_finished_future_is_not_entered_to_drop_an_unfinished_one_drops_inside() {
        let enters = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(Enters(enters.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let done = InSpan::new(tracing::info_span!("probe"), async { 7 });
            assert_eq!(done.now_or_never(), Some(7));
            assert_eq!(enters.load(Ordering::SeqCst), 1, "entered to poll only");

            let dropped_in = Arc::new(Mutex::new(None));
            let probe = Probe(dropped_in.clone());
            let pending = InSpan::new(tracing::info_span!("probe"), async move {
                let _probe = probe;
                std::future::pending::<()>().await
            });
            assert!(pending.now_or_never().is_none());
            assert_eq!(
                enters.load(Ordering::SeqCst),
                3,
                "entered to poll and to drop"
            );
            assert_eq!(*dropped_in.lock().unwrap(), Some("probe"));
        });
    }
}
