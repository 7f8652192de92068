//! The benchmark harness of workflow-rs.
//!
//! ```text
//! cargo run --release -p workflow-bench -- all
//! cargo run --release -p workflow-bench -- sequential --trials 5
//! cargo run --release -p workflow-bench -- w1 --store sqlite
//! cargo run --release -p workflow-bench --features postgres -- all --postgres postgres://postgres@127.0.0.1:5432/test
//! cargo run --release -p workflow-bench --all-features -- common --store sqlite --against d49fa74 --pairs 3
//! ```
//!
//! Every invocation measures the machine's baseline (a durable single-row SQLite commit and a
//! small write + fsync) first, then the chosen scenarios, each trial on a fresh database, and
//! prints one table: median (min .. max) over the trials, the ratio to the baseline commit, and
//! the target where the scenario has one. See BENCHMARKS.md.

mod chains;
mod common;
mod compare;
mod flows;
mod history;
mod messages;
mod report;
mod scale;
mod scenarios;
mod schedules;
mod spans;
mod stores;
mod streams;
mod transactional;

use clap::{Parser, ValueEnum};

use report::Report;
use scenarios::{Ctx, Sizes};
use stores::StoreKind;

#[global_allocator]
static ALLOCATOR: history::Counting = history::Counting;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type BoxResult<T> = std::result::Result<T, BoxError>;

/// A scenario, or a group of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Everything below, in order.
    All,
    /// One durable SQLite commit and one small write + fsync (always measured first).
    Baseline,
    /// One workflow of 1000 sequential no-op steps.
    Sequential,
    /// 1000 concurrent workflows × 10 steps.
    Throughput,
    /// Replay of 1,000 / 10,000 / 100,000-step histories after a restart.
    Recovery,
    /// Recovery of 5,000- and 50,000-event histories: time, time per event, peak memory.
    History,
    /// 1000 concurrent starts claiming one hook token.
    #[value(alias = "storm")]
    StartStorm,
    /// resume_hook → the workflow observes the payload, live and evicted.
    #[value(alias = "hooks")]
    HookLatency,
    /// Resident memory per run suspended on a hook (100,000 runs).
    Memory,
    /// `testing::replay` of an exported 10,000-step history (a replay test of a new build).
    #[value(alias = "replay")]
    ReplayTest,
    /// Steps/s and CPU per step with 1, 2 and 3 worker processes on one database.
    #[value(alias = "scale")]
    ScaleOut,
    /// A parent starting a 1-step child and awaiting its result, one at a time: p50.
    #[value(alias = "child")]
    Children,
    /// Streams: chunks/s of one writer, write → reader latency in-process and across processes.
    Streams,
    /// W0 to W3.
    #[value(alias = "w")]
    Common,
    /// Twenty 1-step workflows one at a time: p50 start→result.
    W0,
    /// One 100-step workflow, 5 times: per-step time.
    W1,
    /// 1000 starts over 100 idempotency tokens, 100 in flight.
    W2,
    /// 1000 1-step workflows, 100 in flight: workflows/s (W3), and the same in one queue of
    /// concurrency 100 (W3q).
    W3,
    /// A queue of concurrency 1: from a slot's release to the next queued run's first step.
    #[value(alias = "handoff")]
    QueueHandoff,
    /// A transactional step against a plain step + a separate write of the same row: per step.
    #[value(alias = "tx")]
    Transactional,
    /// Schedules: a tick's lateness (nominal time → first step), 1,000 every-second schedules
    /// on one worker (lateness, CPU per tick), and the firing loop's idle CPU.
    #[value(alias = "schedule")]
    Schedules,
    /// Only the 1,000 every-second schedules on one worker of `schedules`: lateness p99, CPU
    /// per tick (to profile the firing path or compare builds on it).
    ScheduleLoad,
    /// Talking to a running run: send → recv p50 in-process, request → reply p50, messages/s
    /// from eight senders into one run.
    #[value(alias = "message")]
    Messages,
    /// Continue-as-new: per continuation, a chain of runs continuing at once.
    #[value(name = "continue-as-new", alias = "chains")]
    ContinueAsNew,
    /// One step attempt's span under each subscriber a service may run (none, fmt, and with
    /// the feature `otel` the OpenTelemetry layer): time and process CPU per span.
    #[value(alias = "span")]
    Spans,
}

#[derive(Debug, Parser)]
#[command(
    name = "workflow-bench",
    about = "Benchmarks of workflow-rs: figures are medians (min .. max) over trials, each on a fresh database"
)]
struct Cli {
    /// What to run.
    #[arg(value_enum, default_value = "all")]
    scenario: Scenario,
    /// Trials per figure.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    trials: u32,
    /// Run only on these stores (repeatable); default: each scenario's own set.
    #[arg(long = "store", value_enum)]
    stores: Vec<StoreKind>,
    /// PostgreSQL URL for the PostgreSQL figures (a fresh schema per trial, dropped after).
    #[arg(long, env = "WORKFLOW_BENCH_DATABASE_URL")]
    postgres: Option<String>,
    /// Tiny sizes: checks that every scenario works, measures nothing meaningful.
    #[arg(long)]
    quick: bool,
    /// Compare with a build of this git revision: both builds run the same scenarios, one
    /// after the other, in `--pairs` back-to-back pairs, printed side by side with the ratio
    /// of their medians. The revision is built once into target/bench-compare/.
    #[arg(long, value_name = "REV")]
    against: Option<String>,
    /// Encrypt every payload (AES-256-GCM with a per-run key), to compare
    /// with the same figures without.
    #[arg(long)]
    encrypt: bool,
    /// With `--encrypt`: seal in the envelope's compact form, a string
    /// (`Keys::compact_envelopes`), instead of an object of one field.
    #[arg(long, requires = "encrypt")]
    compact_envelopes: bool,
    /// W3: each run takes and returns a text of this many bytes (its step too) instead of a
    /// number, to see what a payload's size costs (with and without `--encrypt`).
    #[arg(long, value_name = "BYTES")]
    payload_bytes: Option<usize>,
    /// Install what a production service runs with: a Prometheus metrics recorder
    /// (metrics-exporter-prometheus, no listener) and a `tracing` subscriber at INFO writing to
    /// a sink, so every metric and span the runtime emits is recorded and formatted. To compare
    /// with the same figures without (the pair that measures what telemetry costs).
    #[arg(long)]
    telemetry: bool,
    /// Pairs to run with `--against`.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pairs: u32,
}

impl Cli {
    /// The arguments that run the same measurement in another build (without `--against`).
    fn forwarded(&self) -> Vec<String> {
        let mut args = vec![
            self.scenario
                .to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default(),
            "--trials".to_owned(),
            self.trials.to_string(),
        ];
        for store in &self.stores {
            if let Some(v) = store.to_possible_value() {
                args.extend(["--store".to_owned(), v.get_name().to_owned()]);
            }
        }
        if let Some(url) = &self.postgres {
            args.extend(["--postgres".to_owned(), url.clone()]);
        }
        if self.quick {
            args.push("--quick".to_owned());
        }
        if self.encrypt {
            args.push("--encrypt".to_owned());
        }
        if self.compact_envelopes {
            args.push("--compact-envelopes".to_owned());
        }
        if self.telemetry {
            args.push("--telemetry".to_owned());
        }
        if let Some(b) = self.payload_bytes {
            args.extend(["--payload-bytes".to_owned(), b.to_string()]);
        }
        args
    }
}

/// Runs `scenario` (after the baseline) and returns the report.
async fn run(scenario: Scenario, ctx: &Ctx) -> BoxResult<Report> {
    use Scenario::*;
    let mut rep = Report::default();
    eprintln!("measuring the baseline");
    scenarios::baseline(ctx, &mut rep).await?;
    let wanted: &[Scenario] = match scenario {
        All => &[
            Sequential,
            Throughput,
            Recovery,
            History,
            StartStorm,
            HookLatency,
            Memory,
            ReplayTest,
            Children,
            Streams,
            QueueHandoff,
            Schedules,
            Messages,
            Transactional,
            ContinueAsNew,
            Spans,
            ScaleOut,
            W0,
            W1,
            W2,
            W3,
        ],
        Common => &[W0, W1, W2, W3],
        Baseline => &[],
        one => std::slice::from_ref(match one {
            Sequential => &Sequential,
            Throughput => &Throughput,
            Recovery => &Recovery,
            History => &History,
            StartStorm => &StartStorm,
            HookLatency => &HookLatency,
            Memory => &Memory,
            ReplayTest => &ReplayTest,
            Children => &Children,
            ScaleOut => &ScaleOut,
            Streams => &Streams,
            QueueHandoff => &QueueHandoff,
            Schedules => &Schedules,
            ScheduleLoad => &ScheduleLoad,
            Messages => &Messages,
            Transactional => &Transactional,
            ContinueAsNew => &ContinueAsNew,
            Spans => &Spans,
            W0 => &W0,
            W1 => &W1,
            W2 => &W2,
            _ => &W3,
        }),
    };
    for s in wanted {
        eprintln!("running {s:?}");
        match s {
            Sequential => scenarios::sequential_steps(ctx, &mut rep).await?,
            Throughput => scenarios::throughput(ctx, &mut rep).await?,
            Recovery => scenarios::recovery(ctx, &mut rep).await?,
            History => history::history(ctx, &mut rep).await?,
            StartStorm => scenarios::start_storm(ctx, &mut rep).await?,
            HookLatency => scenarios::hook_latency(ctx, &mut rep).await?,
            Memory => scenarios::memory(ctx, &mut rep).await?,
            ReplayTest => scenarios::replay_test(ctx, &mut rep).await?,
            Children => common::children(ctx, &mut rep).await?,
            ScaleOut => scale::scale_out(ctx, &mut rep).await?,
            Streams => streams::streams(ctx, &mut rep).await?,
            QueueHandoff => scenarios::queue_handoff(ctx, &mut rep).await?,
            Schedules => schedules::schedules(ctx, &mut rep).await?,
            ScheduleLoad => schedules::schedule_load(ctx, &mut rep).await?,
            Messages => messages::messages(ctx, &mut rep).await?,
            Transactional => transactional::transactional(ctx, &mut rep).await?,
            ContinueAsNew => chains::continue_as_new_cost(ctx, &mut rep).await?,
            Spans => spans::spans_cost(ctx, &mut rep).await?,
            W0 => common::w0(ctx, &mut rep).await?,
            W1 => common::w1(ctx, &mut rep).await?,
            W2 => common::w2(ctx, &mut rep).await?,
            W3 => common::w3(ctx, &mut rep).await?,
            All | Common | Baseline => {}
        }
    }
    Ok(rep)
}

fn title(cli: &Cli) -> String {
    format!(
        "workflow-bench {}{} — {} trial(s) per figure{}; figure: median (min .. max) over trials; \
         × commit: the median ÷ the baseline SQLite commit (rates: time per item ÷ commit)",
        cli.scenario
            .to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default(),
        match (cli.encrypt, cli.telemetry) {
            (true, true) if cfg!(feature = "otel") => {
                " (payloads encrypted, metrics, tracing and OpenTelemetry traces recorded)"
            }
            (true, true) => " (payloads encrypted, metrics and tracing recorded)",
            (true, false) if cli.compact_envelopes => " (payloads encrypted, compact envelopes)",
            (true, false) => " (payloads encrypted)",
            (false, true) if cfg!(feature = "otel") => {
                " (metrics, tracing and OpenTelemetry traces recorded)"
            }
            (false, true) => " (metrics and tracing recorded)",
            (false, false) => "",
        },
        cli.trials,
        if cli.quick {
            ", QUICK sizes (not measurements)"
        } else {
            ""
        },
    )
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if let Some(served) = streams::child().await {
        return served;
    }
    let cli = Cli::parse();
    if let Some(against) = &cli.against {
        return compare::compare(&compare::Comparison {
            against: against.clone(),
            pairs: cli.pairs,
            args: cli.forwarded(),
        });
    }
    stores::ENCRYPT.store(cli.encrypt, std::sync::atomic::Ordering::Relaxed);
    stores::COMPACT.store(cli.compact_envelopes, std::sync::atomic::Ordering::Relaxed);
    let metrics = if cli.telemetry {
        Some(install_telemetry()?)
    } else {
        None
    };
    let ctx = Ctx {
        trials: cli.trials as usize,
        pg_url: cli.postgres.clone().filter(|u| !u.is_empty()),
        stores: (!cli.stores.is_empty()).then(|| cli.stores.clone()),
        sizes: if cli.quick {
            Sizes::tiny()
        } else {
            Sizes::full()
        },
        payload_bytes: cli.payload_bytes,
    };
    let rep = run(cli.scenario, &ctx).await?;
    println!();
    print!("{}", rep.render(&title(&cli)));
    if let Some(handle) = metrics {
        // Proof the recorder saw the runtime's metrics (not a figure of the table).
        let rendered = handle.render();
        let series = rendered
            .lines()
            .filter(|l| l.starts_with("workflow_"))
            .count();
        println!("telemetry: {series} workflow_* series recorded");
        #[cfg(feature = "otel")]
        println!(
            "telemetry: {} spans exported through OpenTelemetry (feature otel)",
            traces::exported()
        );
    }
    Ok(())
}

/// The recorder and subscriber of `--telemetry`: metrics are aggregated as a Prometheus
/// exporter would (histograms included), spans are built and formatted into a sink; built
/// with the feature `otel`, spans are also traces: an OpenTelemetry layer builds every span,
/// the runtime keeps each start's trace context and parents every attempt's span on it, and
/// a batch processor hands them to an exporter that counts and drops them (what a service
/// pays before the network).
fn install_telemetry() -> BoxResult<metrics_exporter_prometheus::PrometheusHandle> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    // Without colours, as a service writing its logs to a file or a collector has them: a
    // sink is no terminal, and ANSI styling of every field was a fifth of what the layers
    // added to W3 under callgrind (nu_ansi_term, 38.5M of 211M instructions).
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::io::sink);
    let registry = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(fmt);
    #[cfg(feature = "otel")]
    let registry = registry.with(traces::layer());
    registry.try_init()?;
    Ok(handle)
}

/// `--telemetry`'s traces (feature `otel`): see [`install_telemetry`].
#[cfg(feature = "otel")]
mod traces {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, LazyLock, OnceLock};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

    /// Spans the exporter of `--telemetry` was handed.
    static EXPORTED: LazyLock<Arc<AtomicU64>> = LazyLock::new(Arc::default);
    /// The provider, kept for the process's life: its batch thread keeps exporting.
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    /// An exporter that counts the spans of each batch into its counter and drops them
    /// (what a service pays before the network); `spans` gives each trial its own.
    #[derive(Debug)]
    pub(crate) struct Counting(pub(crate) Arc<AtomicU64>);

    impl SpanExporter for Counting {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }

    pub fn layer<S>() -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Counting(EXPORTED.clone()))
            .build();
        let tracer = PROVIDER.get_or_init(|| provider).tracer("workflow-bench");
        tracing_opentelemetry::layer().with_tracer(tracer)
    }

    /// Spans exported, once what the batch processor still held is exported too.
    pub fn exported() -> u64 {
        if let Some(provider) = PROVIDER.get() {
            let _ = provider.force_flush();
        }
        EXPORTED.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scenario once, at tiny sizes, on memory and SQLite (and PostgreSQL when
    /// WORKFLOW_BENCH_DATABASE_URL is set and the feature is on). Proves they work; asserts
    /// no timing. One test, because the scenarios share process-wide probes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_scenario_runs_at_a_tiny_size() {
        let mut stores = vec![StoreKind::Memory, StoreKind::Sqlite];
        let pg_url = std::env::var("WORKFLOW_BENCH_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty());
        if cfg!(feature = "postgres") && pg_url.is_some() {
            stores.push(StoreKind::Postgres);
        }
        let ctx = Ctx {
            trials: 1,
            pg_url,
            stores: Some(stores),
            sizes: Sizes::tiny(),
            payload_bytes: None,
        };
        let rep = run(Scenario::All, &ctx).await.expect("every scenario runs");
        let table = rep.render("test");
        for s in [
            "baseline",
            "sequential",
            "throughput",
            "recovery",
            "history",
            "start storm",
            "hook latency",
            "memory",
            "replay test",
            "children",
            "streams",
            "scale-out",
            "queue handoff",
            "schedules",
            "messages",
            "transactional",
            "continue-as-new",
            "spans",
            "W0",
            "W1",
            "W2",
            "W3",
        ] {
            assert!(
                rep.rows.iter().any(|r| r.scenario == s),
                "no row for {s}:\n{table}"
            );
        }
        // Correctness figures hold at any size.
        for r in &rep.rows {
            if r.metric == "runs created" {
                assert_eq!(r.samples, vec![1.0], "{table}");
            }
            if r.metric == "step bodies executed" {
                assert_eq!(r.samples, vec![ctx.sizes.w2_tokens as f64], "{table}");
            }
        }
        assert!(rep.wlines.iter().any(|l| l.starts_with("W0 sqlite ")));
        assert!(rep
            .wlines
            .iter()
            .all(|l| l.split(' ').count() == 4 && l.starts_with('W')));

        // W3 with `--payload-bytes`: every run takes and returns its own text of that size (a
        // run returning another text fails the scenario).
        let ctx = Ctx {
            stores: Some(vec![StoreKind::Memory, StoreKind::Sqlite]),
            payload_bytes: Some(40),
            ..ctx
        };
        let mut rep = Report::default();
        common::w3(&ctx, &mut rep)
            .await
            .expect("W3 runs with texts");
        let table = rep.render("test");
        let sized = rep
            .rows
            .iter()
            .filter(|r| r.scenario == "W3" && r.metric.contains(" 1-step runs, 40-byte texts,"))
            .count();
        assert_eq!(sized, 4, "{table}");
    }

    /// The texts of W3 with `--payload-bytes`: the size asked, letters and digits, each run's
    /// own. (W3 itself runs with them in `every_scenario_runs_at_a_tiny_size`: the scenarios
    /// share process-wide probes, so no other test may run one beside it.)
    #[test]
    fn payload_texts_have_the_size_asked() {
        let text = common::payload_text(7, 40);
        assert_eq!((text.len(), &text[..1]), (40, "7"));
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(text, common::payload_text(8, 40)[..].replacen('8', "7", 1));
        assert_eq!(common::payload_text(12345, 3), "123");
    }

    /// The writer process of the streams scenario's cross-process trials, when this test
    /// binary is re-executed as one.
    #[tokio::test]
    #[ignore = "entry point of the writer processes the streams scenario spawns"]
    async fn stream_writer_child() {
        if let Some(served) = streams::child().await {
            served.expect("the writer serves");
        }
    }

    #[test]
    fn the_command_line_parses() {
        let cli =
            Cli::try_parse_from(["workflow-bench", "w1", "--store", "sqlite", "--trials", "2"])
                .unwrap();
        assert_eq!(cli.scenario, Scenario::W1);
        assert_eq!(cli.stores, vec![StoreKind::Sqlite]);
        assert_eq!(cli.trials, 2);
        assert_eq!(cli.payload_bytes, None);
        let cli = Cli::try_parse_from(["workflow-bench", "w3", "--payload-bytes", "64"]).unwrap();
        assert_eq!(cli.payload_bytes, Some(64));
        assert!(cli
            .forwarded()
            .ends_with(&["--payload-bytes".to_owned(), "64".to_owned()]));
        let cli = Cli::try_parse_from(["workflow-bench"]).unwrap();
        assert_eq!(cli.scenario, Scenario::All);
        assert!(Cli::try_parse_from(["workflow-bench", "storm"]).is_ok());
    }
}
