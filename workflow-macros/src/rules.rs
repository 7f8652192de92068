//! The table of what a `#[workflow]` body must not do: each rule names the paths it matches, why
//! they break replay, and what to use instead. `analyze` matches paths against it; the tests,
//! the ui cases (`ui-tests/tests/ui/determinism/fail/<name>.rs`) and `docs/diagnostics.md` are
//! checked against it, so a rule added here without a test or a doc entry fails the build.
//!
//! Paths are matched by suffix, segment by segment, after `use` aliases inside the workflow are
//! resolved: `SystemTime::now` matches `SystemTime::now()`, `std::time::SystemTime::now()` and
//! `Clock::now()` after `use std::time::SystemTime as Clock;`, but not a user's `now()` or
//! `clock.now()`. Names too common to flag alone (`now`, `spawn`, `sleep`, `random`, `var`) are
//! listed with the segment that qualifies them. A pattern ending in `::*` matches any item of
//! that module, written with the module's last segment or more (`fs::read`, `std::fs::read`,
//! `std::fs::File::open`), except the items listed in `except`.

/// What a rule looks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pattern {
    /// A call or use of any of these paths (suffix patterns, see the module docs).
    Paths(&'static [&'static str]),
    /// `select!` (`tokio::select!`, `futures::select!`) without `biased;`.
    UnbiasedSelect,
    /// Iterating a `HashMap`/`HashSet` bound in the body or taken as an argument.
    HashIteration,
}

/// One thing a workflow must not do.
pub(crate) struct Rule {
    /// Kebab-case identity: the ui case's file name and the docs' anchor.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) name: &'static str,
    pub(crate) pattern: Pattern,
    /// Items of a `module::*` pattern that are deterministic (plain values, constants).
    pub(crate) except: &'static [&'static str],
    /// What the offending code does and why replay cannot reproduce it; follows the code in the
    /// message: "`SystemTime::now()` <what>".
    pub(crate) what: &'static str,
    /// The deterministic alternative, shown as the error's help line.
    pub(crate) instead: &'static str,
    /// A statement that breaks the rule, for the tests and the docs.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) example: &'static str,
    /// The full paths clippy's `disallowed_methods` takes for it (`docs/clippy.toml` must list
    /// them): the second line of defence, which resolves imports the macro cannot see.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) clippy: &'static [&'static str],
}

const CLOCK: &str = "reads the clock, which returns a different time when the run is replayed";
const RANDOM: &str =
    "draws a new random value when the run is replayed, so replay can take a different path";
const USE_RANDOM: &str =
    "use `workflow_core::random::<T>()`: seeded per run, it draws the same values on every replay";
const TASK: &str = "runs work outside the workflow: replay cannot record, order or resume it";
const USE_JOIN: &str = "call `#[step]`s concurrently with `futures::join!`, `try_join!` or \
                        `futures::future::join_all`: their results are recorded";
const IO: &str = "reaches outside the run's recorded history: replay repeats it and may see \
                  something else";
const IN_A_STEP: &str = "do it in a `#[step]`: a step runs once and replay returns its recorded \
                         result";

/// The plain values of `std::net` (addresses), which do no I/O; `net::SocketAddr` could be
/// either module's name for it.
const NET_VALUES: &[&str] = &[
    "IpAddr",
    "Ipv4Addr",
    "Ipv6Addr",
    "SocketAddr",
    "SocketAddrV4",
    "SocketAddrV6",
    "Shutdown",
    "AddrParseError",
];

pub(crate) const RULES: &[Rule] = &[
    // The clock.
    Rule {
        name: "system-time-now",
        pattern: Pattern::Paths(&["SystemTime::now"]),
        except: &[],
        what: CLOCK,
        instead: "use `workflow_core::now()`: it returns the same time on every replay",
        example: "let started = std::time::SystemTime::now();",
        clippy: &["std::time::SystemTime::now"],
    },
    Rule {
        name: "instant-now",
        pattern: Pattern::Paths(&["Instant::now"]),
        except: &[],
        what: CLOCK,
        instead: "use `workflow_core::now()`, which returns the same time on every replay, and \
                  measure with `SystemTime::duration_since`",
        example: "let started = std::time::Instant::now();",
        clippy: &["std::time::Instant::now", "tokio::time::Instant::now"],
    },
    Rule {
        name: "chrono-now",
        pattern: Pattern::Paths(&["Utc::now", "Local::now"]),
        except: &[],
        what: CLOCK,
        instead: "use `chrono::DateTime::<chrono::Utc>::from(workflow_core::now())`: the same \
                  time on every replay",
        example: "let started = chrono::Utc::now();",
        clippy: &["chrono::Utc::now", "chrono::Local::now"],
    },
    Rule {
        name: "time-now",
        pattern: Pattern::Paths(&["OffsetDateTime::now_utc", "OffsetDateTime::now_local"]),
        except: &[],
        what: CLOCK,
        instead: "use `time::OffsetDateTime::from(workflow_core::now())`: the same time on \
                  every replay",
        example: "let started = time::OffsetDateTime::now_utc();",
        clippy: &[
            "time::OffsetDateTime::now_utc",
            "time::OffsetDateTime::now_local",
        ],
    },
    // Randomness.
    Rule {
        name: "rand-random",
        pattern: Pattern::Paths(&["rand::random"]),
        except: &[],
        what: RANDOM,
        instead: USE_RANDOM,
        example: "let coin: bool = rand::random();",
        clippy: &["rand::random"],
    },
    Rule {
        name: "thread-rng",
        pattern: Pattern::Paths(&["thread_rng", "rand::rng"]),
        except: &[],
        what: RANDOM,
        instead: USE_RANDOM,
        example: "let mut rng = rand::rng();",
        clippy: &["rand::thread_rng", "rand::rng"],
    },
    Rule {
        name: "entropy-seeded-rng",
        pattern: Pattern::Paths(&["OsRng", "from_entropy", "from_os_rng"]),
        except: &[],
        what: RANDOM,
        instead: "seed the generator from the run: \
                  `SeedableRng::seed_from_u64(workflow_core::random())`",
        example: "let rng = rand::rngs::StdRng::from_os_rng();",
        clippy: &[
            "rand::SeedableRng::from_entropy",
            "rand::SeedableRng::from_os_rng",
        ],
    },
    Rule {
        name: "uuid-new-v4",
        pattern: Pattern::Paths(&["Uuid::new_v4"]),
        except: &[],
        what: RANDOM,
        instead: "build it from the run's seeded randomness: \
                  `uuid::Builder::from_random_bytes(workflow_core::random::<u128>().to_le_bytes())\
                  .into_uuid()`",
        example: "let id = uuid::Uuid::new_v4();",
        clippy: &["uuid::Uuid::new_v4"],
    },
    Rule {
        name: "uuid-now",
        pattern: Pattern::Paths(&["Uuid::now_v7", "Uuid::now_v6", "Uuid::now_v1"]),
        except: &[],
        what: "reads the clock and draws random bits, both different when the run is replayed",
        instead: "create the id in a `#[step]`, whose result is recorded, or pass it in as an \
                  argument",
        example: "let id = uuid::Uuid::now_v7();",
        clippy: &[
            "uuid::Uuid::now_v7",
            "uuid::Uuid::now_v6",
            "uuid::Uuid::now_v1",
        ],
    },
    Rule {
        name: "ulid-new",
        pattern: Pattern::Paths(&["Ulid::new"]),
        except: &[],
        what: "reads the clock and draws random bits, both different when the run is replayed",
        instead: "use `ulid::Ulid::from_datetime_with_source(workflow_core::now(), &mut rng)` \
                  with an rng seeded from `workflow_core::random()`, or create it in a `#[step]`",
        example: "let id = ulid::Ulid::new();",
        clippy: &["ulid::Ulid::new"],
    },
    // Threads and tasks.
    Rule {
        name: "thread-spawn",
        pattern: Pattern::Paths(&["thread::spawn"]),
        except: &[],
        what: TASK,
        instead: USE_JOIN,
        example: "let handle = std::thread::spawn(|| 42);",
        clippy: &["std::thread::spawn"],
    },
    Rule {
        name: "tokio-spawn",
        pattern: Pattern::Paths(&["tokio::spawn", "task::spawn", "spawn_local"]),
        except: &[],
        what: TASK,
        instead: USE_JOIN,
        example: "let handle = tokio::spawn(async { 42 });",
        clippy: &[
            "tokio::spawn",
            "tokio::task::spawn",
            "tokio::task::spawn_local",
        ],
    },
    Rule {
        name: "spawn-blocking",
        pattern: Pattern::Paths(&["spawn_blocking"]),
        except: &[],
        what: TASK,
        instead: "move the blocking work into a `#[step]`: it runs once and its result is \
                  recorded",
        example: "let handle = tokio::task::spawn_blocking(|| 42);",
        clippy: &["tokio::task::spawn_blocking"],
    },
    // Timers.
    Rule {
        name: "thread-sleep",
        pattern: Pattern::Paths(&["thread::sleep"]),
        except: &[],
        what: "blocks the worker thread, and a restart forgets how long it had waited",
        instead: "use `workflow_core::sleep(duration).await`: a durable timer that survives \
                  restarts",
        example: "std::thread::sleep(std::time::Duration::from_secs(1));",
        clippy: &["std::thread::sleep"],
    },
    Rule {
        name: "tokio-sleep",
        pattern: Pattern::Paths(&["time::sleep", "time::sleep_until"]),
        except: &[],
        what: "is a timer in this process's memory: a restart forgets it and waits all over again",
        instead: "use `workflow_core::sleep(duration).await` or `sleep_until(system_time)`: \
                  durable timers that survive restarts",
        example: "tokio::time::sleep(std::time::Duration::from_secs(1)).await;",
        clippy: &["tokio::time::sleep", "tokio::time::sleep_until"],
    },
    Rule {
        name: "tokio-interval",
        pattern: Pattern::Paths(&["time::interval", "time::interval_at"]),
        except: &[],
        what: "ticks by this process's clock: a restart forgets it and ticks at other times",
        instead: "loop over `workflow_core::sleep(period).await`: durable timers that survive \
                  restarts",
        example: "let ticks = tokio::time::interval(std::time::Duration::from_secs(1));",
        clippy: &["tokio::time::interval", "tokio::time::interval_at"],
    },
    Rule {
        name: "tokio-timeout",
        pattern: Pattern::Paths(&["time::timeout", "time::timeout_at"]),
        except: &[],
        what: "races a timer in this process's memory, so replay can see the other outcome",
        instead: "race the future against `workflow_core::sleep` in \
                  `tokio::select! { biased; .. }`: the durable timer fires at the same point on \
                  every replay",
        example:
            "let out = tokio::time::timeout(std::time::Duration::from_secs(1), async { 1 }).await;",
        clippy: &["tokio::time::timeout", "tokio::time::timeout_at"],
    },
    // The environment and I/O.
    Rule {
        name: "env",
        pattern: Pattern::Paths(&["std::env::*"]),
        except: &["consts"],
        what: "reads the process environment, which can differ on the worker that replays the run",
        instead: "pass the value in as a workflow argument, or read it in a `#[step]`, whose \
                  result is recorded",
        example: "let region = std::env::var(\"REGION\");",
        clippy: &[
            "std::env::var",
            "std::env::var_os",
            "std::env::vars",
            "std::env::args",
            "std::env::current_dir",
        ],
    },
    Rule {
        name: "std-fs",
        pattern: Pattern::Paths(&["std::fs::*"]),
        except: &[],
        what: IO,
        instead: IN_A_STEP,
        example: "let config = std::fs::read_to_string(\"config.toml\");",
        clippy: &[
            "std::fs::read",
            "std::fs::read_to_string",
            "std::fs::write",
            "std::fs::read_dir",
            "std::fs::metadata",
            "std::fs::File::open",
            "std::fs::File::create",
        ],
    },
    Rule {
        name: "tokio-fs",
        pattern: Pattern::Paths(&["tokio::fs::*"]),
        except: &[],
        what: IO,
        instead: IN_A_STEP,
        example: "let config = tokio::fs::read_to_string(\"config.toml\").await;",
        clippy: &[
            "tokio::fs::read",
            "tokio::fs::read_to_string",
            "tokio::fs::write",
            "tokio::fs::read_dir",
            "tokio::fs::metadata",
            "tokio::fs::File::open",
            "tokio::fs::File::create",
        ],
    },
    Rule {
        name: "std-net",
        pattern: Pattern::Paths(&["std::net::*"]),
        except: NET_VALUES,
        what: IO,
        instead: IN_A_STEP,
        example: "let stream = std::net::TcpStream::connect(\"example.com:80\");",
        clippy: &[
            "std::net::TcpStream::connect",
            "std::net::TcpListener::bind",
            "std::net::UdpSocket::bind",
        ],
    },
    Rule {
        name: "tokio-net",
        pattern: Pattern::Paths(&["tokio::net::*"]),
        except: NET_VALUES,
        what: IO,
        instead: IN_A_STEP,
        example: "let stream = tokio::net::TcpStream::connect(\"example.com:80\").await;",
        clippy: &[
            "tokio::net::TcpStream::connect",
            "tokio::net::TcpListener::bind",
            "tokio::net::UdpSocket::bind",
            "tokio::net::lookup_host",
        ],
    },
    Rule {
        name: "stdin",
        pattern: Pattern::Paths(&["io::stdin"]),
        except: &[],
        what: IO,
        instead: IN_A_STEP,
        example: "let input = std::io::stdin();",
        clippy: &["std::io::stdin", "tokio::io::stdin"],
    },
    Rule {
        name: "process-command",
        pattern: Pattern::Paths(&["process::Command::new"]),
        except: &[],
        what: IO,
        instead: IN_A_STEP,
        example: "let child = std::process::Command::new(\"ls\").spawn();",
        clippy: &["std::process::Command::new", "tokio::process::Command::new"],
    },
    // Concurrency whose outcome is random.
    Rule {
        name: "unbiased-select",
        pattern: Pattern::UnbiasedSelect,
        except: &[],
        what: "picks among ready branches at random, so replay can take another branch",
        instead: "add `biased;` as the first line of `tokio::select!` (branches are then polled \
                  in order), or use `futures::select_biased!`",
        example: "tokio::select! { _ = sleep(Duration::from_secs(1)) => {}, _ = async {} => {} }",
        clippy: &[],
    },
    Rule {
        name: "hash-map-iteration",
        pattern: Pattern::HashIteration,
        except: &[],
        what: "visits the entries in an order that differs in every process, so replay can take \
               another path",
        instead: "use a `BTreeMap`/`BTreeSet`, whose order is the keys' order, or sort the \
                  entries before iterating",
        example: "let mut totals = std::collections::HashMap::new(); totals.insert(1, 2); \
                  for (k, v) in &totals { let _ = (k, v); }",
        clippy: &[],
    },
];

/// The rule for `select!` without `biased;`.
pub(crate) fn unbiased_select() -> &'static Rule {
    rule_for(Pattern::UnbiasedSelect)
}

/// The rule for iterating a `HashMap`/`HashSet`.
pub(crate) fn hash_iteration() -> &'static Rule {
    rule_for(Pattern::HashIteration)
}

fn rule_for(pattern: Pattern) -> &'static Rule {
    RULES
        .iter()
        .find(|rule| rule.pattern == pattern)
        .expect("the table has a rule for each pattern")
}

/// The first rule matching `path` (its segments, aliases already resolved), if any. Paths into
/// `workflow_core` itself are the deterministic stand-ins and never match.
pub(crate) fn matching(path: &[String]) -> Option<&'static Rule> {
    if path.first().is_some_and(|first| first == "workflow_core") {
        return None;
    }
    RULES.iter().find(|rule| match rule.pattern {
        Pattern::Paths(patterns) => patterns
            .iter()
            .any(|pattern| matches(pattern, rule.except, path)),
        _ => false,
    })
}

/// Whether `path` matches the suffix `pattern` (see the module docs).
fn matches(pattern: &str, except: &[&str], path: &[String]) -> bool {
    let pattern: Vec<&str> = pattern.split("::").collect();
    match pattern.split_last() {
        Some((&"*", module)) => {
            // `path` = (a non-empty suffix of `module`) ++ (at least one item segment).
            (1..=module.len().min(path.len().saturating_sub(1))).any(|written| {
                path[..written]
                    .iter()
                    .zip(&module[module.len() - written..])
                    .all(|(segment, expected)| segment == expected)
                    && !except.contains(&path[written].as_str())
            })
        }
        _ => {
            path.len() >= pattern.len()
                && path[path.len() - pattern.len()..]
                    .iter()
                    .zip(&pattern)
                    .all(|(segment, expected)| segment == expected)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matching, Pattern, RULES};

    fn rule(path: &str) -> Option<&'static str> {
        let segments: Vec<String> = path.split("::").map(str::to_owned).collect();
        matching(&segments).map(|rule| rule.name)
    }

    #[test]
    fn suffixes_match_from_the_qualifying_segment() {
        assert_eq!(rule("SystemTime::now"), Some("system-time-now"));
        assert_eq!(rule("std::time::SystemTime::now"), Some("system-time-now"));
        assert_eq!(rule("time::SystemTime::now"), Some("system-time-now"));
        assert_eq!(rule("tokio::time::Instant::now"), Some("instant-now"));
        assert_eq!(rule("thread_rng"), Some("thread-rng"));
        assert_eq!(rule("rand::thread_rng"), Some("thread-rng"));
        assert_eq!(rule("tokio::task::spawn"), Some("tokio-spawn"));
        assert_eq!(rule("tokio::time::sleep"), Some("tokio-sleep"));
    }

    #[test]
    fn common_names_alone_do_not_match() {
        for path in [
            "now",
            "spawn",
            "sleep",
            "random",
            "rng",
            "var",
            "read",
            "Clock::now",
            "SystemTime",
            "SystemTime::UNIX_EPOCH",
            "Utc",
            "workflow_core::now",
            "workflow_core::sleep",
            "workflow_core::random",
            "workflow_core::time::sleep",
        ] {
            assert_eq!(rule(path), None, "{path}");
        }
    }

    #[test]
    fn module_wildcards_need_the_module_and_an_item() {
        assert_eq!(rule("fs::read"), Some("std-fs"));
        assert_eq!(rule("std::fs::read_to_string"), Some("std-fs"));
        assert_eq!(rule("std::fs::File::open"), Some("std-fs"));
        assert_eq!(rule("tokio::fs::read"), Some("tokio-fs"));
        assert_eq!(rule("env::var"), Some("env"));
        assert_eq!(rule("net::TcpStream::connect"), Some("std-net"));
        for path in [
            "fs",
            "std::fs",
            "my::fs::read",
            "crate::fs::read",
            "env::consts::OS",
            "std::net::Ipv4Addr::new",
            "net::SocketAddr::from",
        ] {
            assert_eq!(rule(path), None, "{path}");
        }
    }

    /// The repository root, where `docs/` and `ui-tests/` are.
    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workflow-macros is in the workspace")
            .to_path_buf()
    }

    #[test]
    fn the_shipped_clippy_config_lists_every_rules_paths() {
        let config = std::fs::read_to_string(root().join("docs/clippy.toml"))
            .expect("docs/clippy.toml is readable");
        for rule in RULES {
            for path in rule.clippy {
                assert!(
                    config.contains(&format!("path = \"{path}\"")),
                    "docs/clippy.toml does not list `{path}` ({})",
                    rule.name
                );
            }
        }
    }

    #[test]
    fn every_rule_is_documented() {
        let docs = std::fs::read_to_string(root().join("docs/diagnostics.md"))
            .expect("docs/diagnostics.md is readable");
        for rule in RULES {
            for entry in [
                format!("#### `{}`", rule.name),
                format!("| [`{0}`](#{0}) |", rule.name),
            ] {
                assert!(docs.contains(&entry), "docs/diagnostics.md lacks `{entry}`");
            }
            assert!(
                docs.contains(rule.instead.split(':').next().unwrap_or(rule.instead)),
                "docs/diagnostics.md does not show the help of {}",
                rule.name
            );
        }
    }

    #[test]
    fn every_rule_has_a_ui_case() {
        for rule in RULES {
            let case = root().join(format!(
                "ui-tests/tests/ui/determinism/fail/{}.rs",
                rule.name
            ));
            assert!(
                case.exists(),
                "{} has no ui case at {}",
                rule.name,
                case.display()
            );
        }
    }

    #[test]
    fn every_rule_is_well_formed() {
        for (i, rule) in RULES.iter().enumerate() {
            assert!(
                RULES[..i].iter().all(|other| other.name != rule.name),
                "{} is in the table twice",
                rule.name
            );
            assert!(
                rule.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{} is not kebab-case",
                rule.name
            );
            assert!(!rule.what.ends_with('.') && !rule.instead.ends_with('.'));
            assert!(rule.instead.starts_with(|c: char| c.is_lowercase()));
            if let Pattern::Paths(paths) = rule.pattern {
                assert!(!paths.is_empty());
            }
        }
    }
}
