//! What the spans of a run cost under the subscribers a service runs: the runtime
//! opens an INFO `step` span per attempt and, with the feature `otel`, a `workflow.start` span
//! per run, whose context the attempts' spans continue; each costs whatever the installed
//! layers do with it. Here spans of the same shapes (the same fields, the attempt's with an
//! OpenTelemetry parent set, entered twice, its outcome recorded) are opened and closed many
//! times under each subscriber, on one thread: an attempt's span alone, and (with `otel`) a
//! run's start and attempt spans. Printed: the thread's time and the process's CPU (the batch
//! exporter's thread included) per span or per run.
//!
//! The subscribers: none, an INFO fmt layer writing to a sink (a service's logs), and with the
//! feature `otel` the `tracing-opentelemetry` layer with its defaults (location, thread and
//! busy/idle attributes), the same without those three, and fmt with the default layer. The
//! OpenTelemetry layers hand spans to a batch processor whose exporter counts and drops them,
//! its queue large enough for every span of a trial (a span the SDK drops from a full queue
//! costs less than one exported; a note says so if any was dropped all the same).

use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

use crate::report::{Report, Row, Unit};
use crate::scenarios::Ctx;
use crate::schedules::cpu_time;
use crate::BoxResult;

/// One subscriber to measure under.
#[derive(Clone, Copy, Debug)]
enum Subscriber {
    None,
    Fmt,
    #[cfg(feature = "otel")]
    Otel {
        fmt: bool,
        light: bool,
    },
}

impl Subscriber {
    fn all() -> Vec<Subscriber> {
        #[allow(unused_mut)]
        let mut all = vec![Subscriber::None, Subscriber::Fmt];
        #[cfg(feature = "otel")]
        all.extend([
            Subscriber::Otel {
                fmt: false,
                light: false,
            },
            Subscriber::Otel {
                fmt: false,
                light: true,
            },
            Subscriber::Otel {
                fmt: true,
                light: false,
            },
        ]);
        all
    }

    fn label(self) -> &'static str {
        match self {
            Subscriber::None => "no subscriber",
            Subscriber::Fmt => "INFO fmt layer into a sink",
            #[cfg(feature = "otel")]
            Subscriber::Otel {
                fmt: false,
                light: false,
            } => "OpenTelemetry layer, its defaults",
            #[cfg(feature = "otel")]
            Subscriber::Otel {
                fmt: false,
                light: true,
            } => "OpenTelemetry layer without location, threads, busy/idle",
            #[cfg(feature = "otel")]
            Subscriber::Otel { .. } => "fmt + OpenTelemetry layer, its defaults",
        }
    }
}

/// A fmt layer as `--telemetry` installs it: no colours, into a sink.
fn fmt_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::io::sink)
}

/// What a trial measured: the thread's time and the process's CPU per span, and how many
/// spans the exporter got (`None` without an exporter).
struct Trial {
    wall: Duration,
    cpu: Duration,
    exported: Option<u64>,
}

/// Opens and closes `n` step-shaped spans under `sub`.
fn trial(sub: Subscriber, n: u64, with_start: bool) -> Trial {
    let registry =
        tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO);
    let d = match sub {
        Subscriber::None => tracing::Dispatch::new(
            tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::OFF),
        ),
        Subscriber::Fmt => tracing::Dispatch::new(registry.with(fmt_layer())),
        #[cfg(feature = "otel")]
        Subscriber::Otel { fmt, light } => return otel::trial(registry, fmt, light, n, with_start),
    };
    let (wall, cpu) = tracing::dispatcher::with_default(&d, || spans(n, with_start, &|_, _| {}));
    Trial {
        wall,
        cpu,
        exported: None,
    }
}

/// Opens, enters twice, records and closes `n` spans shaped as the runtime's `step` span.
/// `with_start`: each is preceded by a span shaped as a run's `workflow.start` span (opened by
/// `rt.start` with the feature `otel`; its context is what the attempt's span continues).
/// `adopt` gives the attempt's span its OpenTelemetry parent (the start's span, or a fixed
/// context), or does nothing without `otel`.
fn spans(
    n: u64,
    with_start: bool,
    adopt: &dyn Fn(&tracing::Span, Option<&tracing::Span>),
) -> (Duration, Duration) {
    let run_id = workflow_core::RunId::new();
    let (cpu, t) = (cpu_time(), Instant::now());
    for i in 0..n {
        let start = with_start.then(|| {
            tracing::info_span!(
                "workflow.start",
                workflow.name = "bench::one_step",
                workflow.run_id = %run_id,
            )
        });
        let span = tracing::info_span!(
            "step",
            workflow.run_id = %run_id,
            workflow.name = "bench::one_step",
            step.name = "bench::tick",
            step.id = %format_args!("bench::tick#{}", i % 4),
            step.attempt = 1u32,
            step.outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        adopt(&span, start.as_ref());
        // The start's span ends at the run's admission, before its steps finish.
        drop(start);
        span.in_scope(|| std::hint::black_box(i));
        span.in_scope(|| std::hint::black_box(i));
        span.record("step.outcome", "ok");
    }
    (t.elapsed(), cpu_time().saturating_sub(cpu))
}

#[cfg(feature = "otel")]
mod otel {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
    };
    use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{fmt_layer, spans, Trial};
    use crate::traces::Counting;

    pub(super) fn trial<S>(registry: S, fmt: bool, light: bool, n: u64, with_start: bool) -> Trial
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let exported = Arc::new(AtomicU64::new(0));
        // A queue that holds every span of the trial: a service's spans come far slower than
        // this loop makes them, and a span the queue dropped would cost less than one
        // exported.
        let queue = usize::try_from(2 * n).unwrap_or(usize::MAX);
        let processor = BatchSpanProcessor::builder(Counting(exported.clone()))
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(queue)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        let mut layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
        if light {
            layer = layer
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false);
        }
        let d = tracing::Dispatch::new(registry.with(fmt.then(fmt_layer)).with(layer));
        // The parent every attempt's span gets: the context its run's start kept.
        let sc = SpanContext::new(
            TraceId::from_bytes(*b"workflow-rs-span"),
            SpanId::from_bytes(*b"parent!!"),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(sc);
        let (wall, cpu) = tracing::dispatcher::with_default(&d, || {
            spans(n, with_start, &|span, start| {
                let parent = match start {
                    // As the runtime does: the start span's context, read once, continued
                    // as a remote parent.
                    Some(start) => {
                        let started = start.context();
                        let sc = started.span().span_context().clone();
                        let sc = SpanContext::new(
                            sc.trace_id(),
                            sc.span_id(),
                            sc.trace_flags(),
                            true,
                            sc.trace_state().clone(),
                        );
                        opentelemetry::Context::new().with_remote_span_context(sc)
                    }
                    None => cx.clone(),
                };
                let _ = span.set_parent(parent);
            })
        });
        // What the processor still held is exported (and counted) before the figure.
        let _ = provider.force_flush();
        let _ = provider.shutdown();
        Trial {
            wall,
            cpu,
            exported: Some(exported.load(Ordering::Relaxed)),
        }
    }
}

/// The scenario: each subscriber, `ctx.trials` trials of `ctx.sizes.spans` spans; with the
/// feature `otel` also a run's two spans (its start's and one attempt's) per iteration.
pub async fn spans_cost(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let n = ctx.sizes.spans;
    let shapes: &[bool] = if cfg!(feature = "otel") {
        &[false, true]
    } else {
        &[false]
    };
    let cases: Vec<(Subscriber, bool)> = Subscriber::all()
        .into_iter()
        .flat_map(|sub| shapes.iter().map(move |&with_start| (sub, with_start)))
        .collect();
    // Trials of every case in turn, so that a noisy moment falls on all of them alike.
    let mut measured: Vec<(Vec<f64>, Vec<f64>, Vec<u64>)> = vec![Default::default(); cases.len()];
    for _ in 0..ctx.trials {
        for (&(sub, with_start), (wall, cpu, exported)) in cases.iter().zip(&mut measured) {
            crate::scenarios::progress(format!("spans: {}, start: {with_start}", sub.label()));
            let t = tokio::task::spawn_blocking(move || trial(sub, n, with_start)).await?;
            wall.push(t.wall.as_secs_f64() * 1e6 / n as f64);
            cpu.push(t.cpu.as_secs_f64() * 1e6 / n as f64);
            exported.extend(t.exported);
        }
    }
    for ((sub, with_start), (wall, cpu, exported)) in cases.into_iter().zip(measured) {
        let label = sub.label();
        let (what, per) = if with_start {
            ("a run's start and attempt spans", "run")
        } else {
            ("one attempt's span", "span")
        };
        rep.push(
            Row::new(
                "spans",
                "-",
                format!("{label}: {what}, per {per}"),
                Unit::Micros,
            )
            .samples(wall),
        );
        rep.push(
            Row::new(
                "spans",
                "-",
                format!("{label}: {what}, process CPU per {per}"),
                Unit::Micros,
            )
            .samples(cpu),
        );
        let spans = if with_start { 2 * n } else { n };
        if let Some(least) = exported.iter().min().filter(|&&e| e < spans) {
            rep.note(format!(
                "spans, {label}, {what}: the batch processor dropped spans (at least {least} of \
                 {spans} exported in a trial): what a dropped span costs is in the figure"
            ));
        }
    }
    Ok(())
}
