//! Group commit on a committer of its own: which requests go together, which alone, and what
//! each caller hears for every way a transaction can end.

use std::cell::RefCell;

use futures::FutureExt;

use super::*;

/// A write: its id, and whether the committer refuses it (it then writes nothing).
type Req = Request<(u32, bool), u32>;

/// A committer that records what it was asked to write and ends group transactions as told.
struct Fake {
    /// How the next group transaction ends.
    ends: RefCell<Vec<Group>>,
    /// The groups written together, by ids, in the order written.
    together: RefCell<Vec<Vec<u32>>>,
    /// The writes written alone, in order.
    alone: RefCell<Vec<u32>>,
    /// How a write alone ends.
    alone_ends: Result<(), DatabaseError>,
}

impl Fake {
    fn new(ends: Vec<Group>) -> Self {
        Fake {
            ends: RefCell::new(ends),
            together: RefCell::default(),
            alone: RefCell::default(),
            alone_ends: Ok(()),
        }
    }
}

fn answer((id, refused): (u32, bool)) -> Result<u32, StoreError> {
    match refused {
        true => Err(StoreError::LeaseLost(crate::ids::RunId::new())),
        false => Ok(id * 10),
    }
}

impl Committer for Fake {
    type Request = Req;

    fn order(&self, group: &mut [Req]) {
        group.sort_by_key(|r| std::cmp::Reverse(r.write.0));
    }

    async fn together(&self, group: &mut [Req]) -> Group {
        self.together
            .borrow_mut()
            .push(group.iter().map(|r| r.write.0).collect());
        for r in group.iter_mut() {
            let a = answer(r.write);
            r.written(a);
        }
        self.ends.borrow_mut().remove(0)
    }

    async fn alone(&self, r: &mut Req) -> Result<(), DatabaseError> {
        self.alone.borrow_mut().push(r.write.0);
        let a = answer(r.write);
        r.written(a);
        self.alone_ends.clone()
    }
}

/// `writes` as requests, and where each caller waits.
fn requests(writes: &[(u32, bool)]) -> (Vec<Req>, Vec<oneshot::Receiver<Result<u32, StoreError>>>) {
    writes.iter().map(|w| Request::new(*w)).unzip()
}

fn heard(waiting: Vec<oneshot::Receiver<Result<u32, StoreError>>>) -> Vec<String> {
    waiting
        .into_iter()
        .map(|mut w| match w.try_recv() {
            Ok(Ok(v)) => v.to_string(),
            Ok(Err(StoreError::LeaseLost(_))) => "lease lost".into(),
            Ok(Err(StoreError::Database(why))) => format!("failed: {}", why.message()),
            Ok(Err(e)) => format!("{e}"),
            Err(_) => "no answer".into(),
        })
        .collect()
}

#[test]
fn a_group_is_the_first_request_and_what_waits_up_to_the_maximum() {
    let mut waiting = vec![2, 3, 4, 5].into_iter();
    assert_eq!(take(1, 3, || waiting.next()), [1, 2, 3]);
    assert_eq!(waiting.next(), Some(4), "the rest waits for the next group");
    assert_eq!(take(1, 3, || None::<u32>), [1]);
}

#[test]
fn a_committed_group_gives_each_request_its_own_answer_in_its_order() {
    let fake = Fake::new(vec![Group::Committed]);
    let (group, waiting) = requests(&[(1, false), (2, true), (3, false)]);
    commit(&fake, group).now_or_never().unwrap();
    assert_eq!(
        *fake.together.borrow(),
        [vec![3, 2, 1]],
        "in the committer's order"
    );
    assert!(fake.alone.borrow().is_empty());
    assert_eq!(heard(waiting), ["10", "lease lost", "30"]);
}

#[test]
fn a_group_of_one_is_written_alone() {
    let fake = Fake::new(Vec::new());
    let (group, waiting) = requests(&[(7, false)]);
    commit(&fake, group).now_or_never().unwrap();
    assert!(fake.together.borrow().is_empty());
    assert_eq!(*fake.alone.borrow(), [7]);
    assert_eq!(heard(waiting), ["70"]);
}

#[test]
fn a_group_to_redo_is_written_again_each_alone() {
    let fake = Fake::new(vec![Group::Redo]);
    let (group, waiting) = requests(&[(1, false), (2, true)]);
    commit(&fake, group).now_or_never().unwrap();
    assert_eq!(*fake.alone.borrow(), [2, 1]);
    assert_eq!(heard(waiting), ["10", "lease lost"]);
}

#[test]
fn a_failed_group_fails_every_write_but_a_refused_one_keeps_its_answer() {
    let fake = Fake::new(vec![Group::Failed(DatabaseError::new("disk full"))]);
    let (group, waiting) = requests(&[(1, false), (2, true)]);
    commit(&fake, group).now_or_never().unwrap();
    assert_eq!(heard(waiting), ["failed: disk full", "lease lost"]);

    // Alone, the same: the write's own transaction failed.
    let mut fake = Fake::new(Vec::new());
    fake.alone_ends = Err(DatabaseError::new("disk full"));
    let (group, waiting) = requests(&[(3, false)]);
    commit(&fake, group).now_or_never().unwrap();
    assert_eq!(heard(waiting), ["failed: disk full"]);
}

#[test]
fn a_request_never_written_is_an_internal_error_not_a_success() {
    let (request, waiting) = Request::<(), u32>::new(());
    request.finish(Ok(()));
    let heard = heard(vec![waiting]);
    assert!(heard[0].contains("never run"), "{heard:?}");
}
