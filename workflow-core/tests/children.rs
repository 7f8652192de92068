//! Child runs: `start_child` and `child.result()` on every store, and a
//! child awaited across two processes (the child leased by the other one).

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{bounded, resume_when_ready, until_no_active_runs, until_status, Backend, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunFilter};
use workflow_core::{ErrorKind, RunRecord};

// ---------------------------------------------------------------------------------------------
// Workflows

#[step]
async fn double(x: u64) -> Result<u64> {
    Ok(x * 2)
}

#[workflow]
async fn doubler(x: u64) -> Result<u64> {
    double(x).await
}

/// Starts a `doubler` child and adds one to its result.
#[workflow]
async fn parent_of_doubler(x: u64) -> Result<(String, u64)> {
    let child = start_child(doubler, (x,)).await?;
    let id = child.id().to_string();
    Ok((id, child.result().await? + 1))
}

/// Waits for a payload on `token`, then returns it.
#[workflow]
async fn gated(token: String) -> Result<String> {
    let mut gate = create_hook::<String>(token);
    gate.recv().await
}

/// Starts a gated child, then sleeps past the runtime's eviction before awaiting it: the
/// parent is given back to the store and woken by the child's end.
#[workflow]
async fn patient_parent(token: String) -> Result<String> {
    let child = start_child(gated, (token,)).await?;
    sleep(Duration::from_millis(10)).await;
    let got = child.result().await?;
    Ok(format!("child said {got}"))
}

#[workflow]
async fn failing_child() -> Result<u64> {
    Err(Error::fatal("the child broke"))
}

/// Returns the child's error as a value.
#[workflow]
async fn parent_of_failure() -> Result<String> {
    let child = start_child(failing_child, ()).await?;
    match child.result().await {
        Ok(v) => Ok(format!("unexpected {v}")),
        Err(e) => Ok(e.to_string()),
    }
}

/// Starts one attached and one detached gated child, and waits for the attached one.
#[workflow]
async fn parent_of_two(token: String) -> Result<String> {
    let attached = start_child(gated, (format!("{token}-attached"),)).await?;
    let _detached = start_child(gated, (format!("{token}-detached"),))
        .detached()
        .await?;
    attached.result().await
}

/// Starts a child claiming `token`; reports the start's error.
#[workflow]
async fn parent_with_child_hook(token: String) -> Result<String> {
    match start_child(gated, (token.clone(),)).hook(token).await {
        Ok(child) => child.result().await,
        Err(e) => match e.as_hook_conflict() {
            Some(c) => Ok(format!("conflict with {}", c.conflicting_run_id)),
            None => Err(e),
        },
    }
}

/// Starts a gated child with a deadline; reports its result.
#[workflow]
async fn parent_of_slow_child(token: String) -> Result<String> {
    let child = start_child(gated, (token,))
        .timeout(Duration::from_millis(300))
        .await?;
    match child.result().await {
        Ok(v) => Ok(v),
        Err(e) => Ok(format!("child failed: {e}")),
    }
}

/// Starts `n` doubler children at once and awaits them all.
#[workflow]
async fn parent_of_many(n: u64) -> Result<u64> {
    let mut children = Vec::new();
    for i in 0..n {
        children.push(start_child(doubler, (i,)).await?);
    }
    let mut sum = 0;
    for c in children {
        sum += c.result().await?;
    }
    Ok(sum)
}

/// Per group (one per test): how many steps run now, and the most at once.
fn crowds() -> &'static std::sync::Mutex<std::collections::HashMap<String, (u32, u32)>> {
    static C: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, (u32, u32)>>> =
        std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}

/// Counts how many of `group` run at once, for a while.
#[step]
async fn crowded(group: String, i: u64) -> Result<u64> {
    {
        let mut c = crowds().lock().unwrap();
        let e = c.entry(group.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    crowds().lock().unwrap().entry(group).or_default().0 -= 1;
    Ok(i)
}

#[workflow]
async fn crowd_member(group: String, i: u64) -> Result<u64> {
    crowded(group, i).await
}

/// Starts `n` children into queue `queue`, then sums their results.
#[workflow]
async fn parent_of_queued(queue: String, n: u64) -> Result<u64> {
    let group = workflow_metadata().run_id.to_string();
    let mut children = Vec::new();
    for i in 0..n {
        let child = start_child(crowd_member, (group.clone(), i))
            .queue(queue.clone())
            .priority(1)
            .await?;
        children.push(child);
    }
    let mut sum = 0;
    for c in children {
        sum += c.result().await?;
    }
    Ok(sum)
}

/// Sleeps `secs` seconds, durably.
#[workflow]
async fn sleeper(secs: u64) -> Result<String> {
    sleep(Duration::from_secs(secs)).await;
    Ok("woke up".to_owned())
}

/// Starts a 5 s `sleeper` child (`how`: "attached", "own timeout" of an hour, or
/// "detached") and awaits it.
#[workflow]
async fn parent_of_sleeper(how: String) -> Result<String> {
    let start = start_child(sleeper, (5,));
    let child = match how.as_str() {
        "own timeout" => start.timeout(Duration::from_secs(3600)).await?,
        "detached" => start.detached().await?,
        _ => start.await?,
    };
    child.result().await
}

/// Starts a gated child first, then runs two steps, then awaits the child.
#[workflow]
async fn child_first(token: String) -> Result<String> {
    let child = start_child(gated, (token,)).await?;
    let a = double(1).await?;
    let b = double(2).await?;
    let end = child.result().await?;
    Ok(format!("{a}+{b}+{end}"))
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn children_of(rt: &Runtime, parent: RunId) -> Vec<RunRecord> {
    rt.store()
        .list_runs(&RunFilter::new().parent(parent))
        .await
        .unwrap()
}

fn kinds(events: &[workflow_core::store::EventRecord]) -> Vec<&'static str> {
    events.iter().map(|e| e.event.kind()).collect()
}

// ---------------------------------------------------------------------------------------------
// On every store

async fn a_child_result_reaches_its_parent(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(parent_of_doubler, (20,)).await.unwrap();
    let (child_id, value) = run.return_value().await.unwrap();
    assert_eq!(value, 41);
    let children = children_of(&rt, run.id()).await;
    assert_eq!(children.len(), 1, "{children:?}");
    let child = &children[0];
    assert_eq!(child.id.to_string(), child_id);
    assert_eq!(child.parent, Some(run.id()));
    assert_eq!(child.status, RunStatus::Completed);
    assert_eq!(child.workflow, "children::doubler");
    let history = rt.store().events(&run.id()).await.unwrap();
    let k = kinds(&history);
    assert!(
        k.contains(&"child_started") && k.contains(&"child_ended"),
        "{k:?}"
    );
    assert!(
        history.iter().any(|e| matches!(&e.event,
            Event::ChildEnded { child_id: c, result: Ok(v), .. } if *c == child.id && *v == 40)),
        "{history:?}"
    );
    // The child's end left nothing behind in the parent's inbox.
    assert!(rt.store().payloads(&run.id(), 0).await.unwrap().is_empty());
}

async fn an_evicted_parent_is_woken_by_its_child_and_starts_no_second_one(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let token = format!("gate-{}", RunId::new());
    let run = rt.start(patient_parent, (token.clone(),)).await.unwrap();
    // Both wait (the child for its payload, the parent for the child) until they are given
    // back to the store: nothing is left in memory before the child ends.
    let child = loop {
        if let [child] = children_of(&rt, run.id()).await.as_slice() {
            break child.id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    while rt.get_hook_by_token(&token).await.is_err() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_no_active_runs(&rt, "the parent and its waiting child were not evicted").await;
    assert_eq!(run.status().await.unwrap(), RunStatus::Running);
    assert_eq!(
        rt.get_run(&child).status().await.unwrap(),
        RunStatus::Running
    );
    resume_when_ready(&rt, &token, "hello").await;
    assert_eq!(run.return_value().await.unwrap(), "child said hello");
    assert_eq!(children_of(&rt, run.id()).await.len(), 1);
    let history = rt.store().events(&run.id()).await.unwrap();
    let started = history
        .iter()
        .filter(|e| matches!(e.event, Event::ChildStarted { .. }))
        .count();
    assert_eq!(started, 1, "{:?}", kinds(&history));
}

async fn a_failed_child_gives_its_error_to_the_parent(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(parent_of_failure, ()).await.unwrap();
    let message = run.return_value().await.unwrap();
    assert!(message.contains("the child broke"), "{message}");
}

async fn cancelling_a_parent_cancels_its_attached_children_only(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("two-{}", RunId::new());
    let run = rt.start(parent_of_two, (token.clone(),)).await.unwrap();
    let children = loop {
        let c = children_of(&rt, run.id()).await;
        if c.len() == 2 {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Both children hold their hooks before the cancel.
    for suffix in ["attached", "detached"] {
        let t = format!("{token}-{suffix}");
        while rt.get_hook_by_token(&t).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    run.cancel().await.unwrap();
    let (mut attached, mut detached) = (None, None);
    for c in &children {
        let t: (String,) = serde_json::from_value(c.input.clone()).unwrap();
        if t.0.ends_with("-attached") {
            attached = Some(c.id);
        } else {
            detached = Some(c.id);
        }
    }
    let (attached, detached) = (attached.unwrap(), detached.unwrap());
    let info = until_status(&rt, attached, RunStatus::Cancelled).await;
    let error = info.error.expect("a cancelled child has an error");
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert!(error.to_string().contains(&run.id().to_string()), "{error}");
    // The detached child goes on, and ends on its own.
    assert_eq!(
        rt.get_run(&detached).status().await.unwrap(),
        RunStatus::Running
    );
    resume_when_ready(&rt, &format!("{token}-detached"), "still here").await;
    let info = until_status(&rt, detached, RunStatus::Completed).await;
    assert_eq!(info.output, Some(serde_json::json!("still here")));
}

async fn a_child_token_taken_elsewhere_is_a_conflict_at_start(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("owned-{}", RunId::new());
    let owner = rt
        .start(gated, (token.clone(),))
        .hook(&token)
        .await
        .unwrap();
    let run = rt
        .start(parent_with_child_hook, (token.clone(),))
        .await
        .unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        format!("conflict with {}", owner.id())
    );
    assert!(children_of(&rt, run.id()).await.is_empty());
    // The recorded decision: a ChildStarted naming the owner.
    let history = rt.store().events(&run.id()).await.unwrap();
    assert!(history.iter().any(|e| matches!(&e.event,
        Event::ChildStarted { conflict: Some(o), .. } if *o == owner.id())));
    resume_when_ready(&rt, &token, "done").await;
    owner.return_value().await.unwrap();
}

async fn a_child_past_its_deadline_fails_and_its_parent_hears_of_it(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("never-{}", RunId::new());
    let run = rt.start(parent_of_slow_child, (token,)).await.unwrap();
    let message = run.return_value().await.unwrap();
    assert!(
        message.starts_with("child failed:") && message.contains("timed out"),
        "{message}"
    );
    let children = children_of(&rt, run.id()).await;
    assert_eq!(children[0].status, RunStatus::Failed);
}

/// Parents cancelled while their children are ending on their own: every cancel answers,
/// nothing is left running, and the children's ends and the cancellations (which take the
/// same locks in the same order) never wait for each other in a cycle.
async fn cancels_racing_child_ends_all_finish(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let mut parents = Vec::new();
    for _ in 0..10 {
        parents.push(rt.start(parent_of_many, (8,)).await.unwrap());
    }
    for (i, p) in parents.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(i as u64)).await;
        p.cancel().await.unwrap();
    }
    for p in &parents {
        let status = p.status().await.unwrap();
        assert!(
            matches!(status, RunStatus::Cancelled | RunStatus::Completed),
            "{status}"
        );
        for c in children_of(&rt, p.id()).await {
            let c = loop {
                let info = rt.get_run(&c.id).info().await.unwrap();
                if info.status.is_terminal() {
                    break info;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert!(
                matches!(c.status, RunStatus::Cancelled | RunStatus::Completed),
                "{c:?}"
            );
        }
    }
}

/// Children started into a queue wait for its slots like any run;
/// a queue declared nowhere fails the start, recorded, with no child.
async fn children_wait_in_their_queue(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .queue(Queue::new("kids").concurrency(1))
        .build()
        .await
        .unwrap();
    let run = rt
        .start(parent_of_queued, ("kids".to_owned(), 4))
        .await
        .unwrap();
    assert_eq!(run.return_value().await.unwrap(), 6);
    let most = crowds().lock().unwrap()[&run.id().to_string()].1;
    assert_eq!(most, 1, "at most one child of the queue at a time");
    for c in children_of(&rt, run.id()).await {
        let q = c.queue.expect("the child is in its queue");
        assert_eq!((q.name.as_str(), q.priority), ("kids", 1));
    }

    let run = rt
        .start(parent_of_queued, ("nowhere".to_owned(), 1))
        .await
        .unwrap();
    let err = run.return_value().await.unwrap_err();
    assert!(
        err.to_string().contains("unknown queue \"nowhere\""),
        "{err}"
    );
    assert!(children_of(&rt, run.id()).await.is_empty());
    let history = rt.store().events(&run.id()).await.unwrap();
    assert!(history.iter().any(|e| matches!(&e.event,
        Event::ChildStarted { refused: Some(why), .. } if why.contains("nowhere"))));
}

async fn start_child_outside_a_workflow_is_an_error(_b: Backend) {
    let err = start_child(doubler, (1,)).await.unwrap_err();
    assert!(err.to_string().contains("outside a workflow"), "{err}");
}

/// A parent with a 1 s deadline awaiting a child that sleeps 5 s: an attached child ends
/// (failed, timed out) at the parent's deadline, the same instant; a child with its own
/// `.timeout(1h)` outlives the parent, and a detached one inherits nothing.
async fn a_child_inherits_its_parents_deadline(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db.runtime().await;
    let mut started = Vec::new();
    for how in ["attached", "own timeout", "detached"] {
        let began = Instant::now();
        let run = rt
            .start(parent_of_sleeper, (how.to_owned(),))
            .timeout(Duration::from_secs(1))
            .await
            .unwrap();
        started.push((how, began, run));
    }
    for (how, began, run) in &started {
        let err = run.return_value().await.unwrap_err();
        assert!(err.to_string().contains("timed out"), "{how}: {err}");
        let parent = run.info().await.unwrap();
        let children = loop {
            let c = children_of(&rt, run.id()).await;
            if !c.is_empty() {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(children.len(), 1, "{how}: {children:?}");
        let child = &children[0];
        match *how {
            "attached" => {
                assert_eq!(child.deadline, parent.deadline, "the same instant");
                let child = until_status(&rt, child.id, RunStatus::Failed).await;
                let took = began.elapsed();
                assert!(took < Duration::from_secs(4), "ended after {took:?}");
                let error = child.error.expect("a failed child has an error");
                assert!(error.to_string().contains("timed out"), "{error}");
            }
            "own timeout" => {
                let own = child.deadline.expect("its own deadline");
                let parent_deadline = parent.deadline.expect("the parent's deadline");
                assert!(
                    own > parent_deadline + Duration::from_secs(3000),
                    "{own:?} {parent_deadline:?}"
                );
            }
            _ => assert_eq!(child.deadline, None, "a detached child inherits nothing"),
        }
    }
    // The parents failed a while ago; the children with a deadline of their own or none are
    // still sleeping.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (how, _, run) in &started[1..] {
        let child = children_of(&rt, run.id()).await.remove(0);
        assert_eq!(child.status, RunStatus::Running, "{how}: {child:?}");
        rt.get_run(&child.id).cancel().await.unwrap();
    }
}

/// `fork(1)` and `fork(2)` of a run whose first command starts a child keep that child: no
/// second child is started, and the copies' `child.result()` gives the original child's end,
/// whether the child ends after the fork or had ended before it. The runs are given back to
/// the store while they wait (a copy is woken again to read its child's record).
async fn a_fork_keeps_the_children_started_before_its_cut(b: Backend) {
    let db = common::TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let token = format!("fork-{}", RunId::new());
    let run = rt.start(child_first, (token.clone(),)).await.unwrap();
    // The original ran both steps and waits for its child.
    loop {
        let events = rt.store().events(&run.id()).await.unwrap();
        let done = events
            .iter()
            .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
            .count();
        if done == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gated_runs = || async {
        rt.store()
            .list_runs(&RunFilter::new().workflow("children::gated"))
            .await
            .unwrap()
    };
    // Forked while the child still runs.
    let early = [run.fork(1).await.unwrap(), run.fork(2).await.unwrap()];
    tokio::time::sleep(Duration::from_millis(500)).await;
    for fork in &early {
        assert_eq!(fork.status().await.unwrap(), RunStatus::Running);
        assert!(children_of(&rt, fork.id()).await.is_empty());
    }
    assert_eq!(gated_runs().await.len(), 1, "no second child");
    resume_when_ready(&rt, &token, "hello").await;
    assert_eq!(run.return_value().await.unwrap(), "2+4+hello");
    for fork in &early {
        assert_eq!(fork.return_value().await.unwrap(), "2+4+hello");
        let history = rt.store().events(&fork.id()).await.unwrap();
        assert!(
            history.iter().any(|e| matches!(&e.event,
                Event::ChildEnded { result: Ok(v), .. } if *v == "hello")),
            "{:?}",
            kinds(&history)
        );
    }
    // Forked after the child (and the original) ended.
    for from in [1, 2] {
        let fork = run.fork(from).await.unwrap();
        assert_eq!(fork.return_value().await.unwrap(), "2+4+hello");
        assert!(children_of(&rt, fork.id()).await.is_empty());
    }
    let children = gated_runs().await;
    assert_eq!(children.len(), 1, "no second child: {children:?}");
    assert_eq!(children[0].parent, Some(run.id()));
}

on_every_store!(
    a_child_result_reaches_its_parent,
    a_fork_keeps_the_children_started_before_its_cut,
    a_child_inherits_its_parents_deadline,
    an_evicted_parent_is_woken_by_its_child_and_starts_no_second_one,
    a_failed_child_gives_its_error_to_the_parent,
    cancelling_a_parent_cancels_its_attached_children_only,
    a_child_token_taken_elsewhere_is_a_conflict_at_start,
    a_child_past_its_deadline_fails_and_its_parent_hears_of_it,
    cancels_racing_child_ends_all_finish,
    children_wait_in_their_queue,
    start_child_outside_a_workflow_is_an_error,
);

// ---------------------------------------------------------------------------------------------
// Across two processes

#[step]
async fn where_am_i(x: u64) -> Result<(u32, u64)> {
    Ok((std::process::id(), x))
}

#[workflow]
async fn remote_child(x: u64) -> Result<(u32, u64)> {
    where_am_i(x).await
}

#[workflow]
async fn parent_here(x: u64) -> Result<(u32, u32, u64)> {
    let (me, _) = where_am_i(0).await?;
    let child = start_child(remote_child, (x,)).await?;
    let (there, y) = child.result().await?;
    Ok((me, there, y))
}

/// A worker process: `WF_MODE=work` drives runs until killed.
#[test]
#[ignore = "entry point of the worker processes the cross-process tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let place = common::Place::from_env();
        let _worker = place
            .builder()
            .poll_interval(Duration::from_millis(50))
            .build()
            .await
            .unwrap();
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

/// The parent is driven here, by a worker with room for one run only, so the child can only
/// be leased by the other process; the child's end there wakes the parent here.
async fn child_awaited_across_processes(place: common::Place) {
    let env = place.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let other = Worker::spawn(&env);
    other.line("READY", Duration::from_secs(60));
    let rt = place
        .builder()
        .poll_interval(Duration::from_millis(50))
        .max_active_runs(1)
        .evict_after(Duration::from_secs(600))
        .build()
        .await
        .unwrap();
    let began = Instant::now();
    let run = rt.start(parent_here, (21,)).await.unwrap();
    let (me, there, y) = run.return_value().await.unwrap();
    println!(
        "{}: parent in pid {me}, child in pid {there}, result after {:?}",
        place.name(),
        began.elapsed()
    );
    assert_eq!(me, std::process::id(), "the parent ran here");
    assert_eq!(there, other.pid(), "the child ran in the other process");
    assert_eq!(y, 21);
    other.kill();
}

#[cfg(feature = "sqlite")]
#[test]
fn a_child_is_awaited_across_processes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let place = common::Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(child_awaited_across_processes(place)));
}

#[cfg(feature = "postgres")]
#[test]
fn a_child_is_awaited_across_processes_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        let place = common::Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        };
        child_awaited_across_processes(place).await;
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    }));
}
