//! Found by a fresh-eyes review of the agent as a `Claimer`, a `Finisher`
//! and a `Worker`: what a claim does between its read of the pause state and
//! its commands, what it does while it holds the claim gate that the agents
//! on clones of one `Queue` share, how long a kept permit stays kept, and
//! what wakes an idle agent under a global concurrency. Memory store, paused
//! tokio time; a `HoldBack` makes one store command slow.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Processed, Queue, Task};
use store_memory::MemoryStore;
use tokio::time::Instant;

use crate::hold_back::{HoldBack, Op};

/// The permit command of the global concurrency (a claim on the control collection).
fn permit_claim(c: &store_trait::Collection, op: Op<'_>) -> bool {
    c.as_str() == "jobs_control" && matches!(op, Op::Claim(_))
}

/// README: "A pause is seen within `CONTROL_REFRESH` even when notifications
/// come late or not at all. A paused agent claims nothing". The claim looks
/// at the pause state once, then takes its permits, then claims: a slow
/// permit command (here held 3 s) lets the claim go out long after the pause
/// was due to be seen (1 s after it was written). On the parent commit the
/// claim looked again once it had its permits, just before claiming.
#[tokio::test(start_paused = true)]
async fn a_slow_permit_lets_a_claim_past_a_pause_due_long_before() {
    let store = MemoryStore::builder().change_streams(false).build();
    let held = HoldBack::new(store.clone());
    let q = Queue::new(held.clone(), "jobs").unwrap();
    let agent = Agent::on_queue(&q, "w").global_concurrency(2).build().unwrap();
    // A claim that reads the pause state (not paused) and finds nothing.
    assert!(agent.process(|_t: Task| async { true }).await.unwrap().is_none());
    let read = Instant::now();
    // Paused right after that read, then a task arrives.
    q.set_paused("w", true).await.unwrap();
    let paused_at = Instant::now();
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    // The next claim, while the read is still fresh: its permit is slow.
    tokio::time::sleep_until(read + Duration::from_millis(900)).await;
    held.hold_next(permit_claim);
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.process(|_t: Task| async { true }).await }
    });
    tokio::time::timeout(Duration::from_secs(5), held.reached()).await.expect("the permit command was held");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = Instant::now();
    held.open();
    let got = run.await.unwrap().unwrap();
    assert!(
        got.is_none(),
        "paused {:?} before the claim went out (bound: {:?}), yet the paused agent claimed and ran: {got:?}",
        opened - paused_at,
        mongoagent::CONTROL_REFRESH
    );
}

/// The claim gate is one lock for every agent name on clones of one queue;
/// the claim now takes its permits of the global concurrency while it holds
/// it. So a slow permit command of name `a` holds up every other name's
/// claims on the queue's clones (here `b`, with no limit at all). On the
/// parent commit permits were taken before the gate.
#[tokio::test(start_paused = true)]
async fn a_slow_permit_of_one_name_stalls_another_names_claims() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let q = Queue::new(held.clone(), "jobs").unwrap();
    let a = Agent::on_queue(&q.clone(), "a").global_concurrency(2).build().unwrap();
    let b = Agent::on_queue(&q.clone(), "b").build().unwrap();
    // Slots of `a`'s semaphore exist.
    assert!(a.process(|_t: Task| async { true }).await.unwrap().is_none());
    q.enqueue(NewTask::new("b", doc! {}).id("tb")).await.unwrap();
    held.hold_next(permit_claim);
    let ra = tokio::spawn({
        let a = a.clone();
        async move { a.process(|_t: Task| async { true }).await }
    });
    tokio::time::timeout(Duration::from_secs(5), held.reached()).await.expect("a's permit command was held");
    let started: Arc<Mutex<Option<Duration>>> = Arc::default();
    let epoch = Instant::now();
    let rb = tokio::spawn({
        let (b, started) = (b.clone(), started.clone());
        async move {
            b.work(move |_t: Task| {
                *started.lock().unwrap() = Some(epoch.elapsed());
                async { true }
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    let at = *started.lock().unwrap();
    held.open();
    b.shutdown();
    ra.await.unwrap().unwrap();
    rb.await.unwrap().unwrap();
    assert!(at.is_some(), "b's ready task did not start in 30 s while a's permit command was slow");
}

/// `Agent::shutdown`: "Stops `Agent::work`: no new claims; in-flight tasks
/// get the drain timeout". An agent with nothing in flight that waits for its
/// turn at the claim gate (another agent on a clone of its queue, here of
/// another name, has a slow claim) does not stop until that claim returns:
/// its claim is not raced against the shutdown.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_another_agents_slow_claim() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let q = Queue::new(held.clone(), "jobs").unwrap();
    let a = Agent::on_queue(&q.clone(), "a").build().unwrap();
    let b = Agent::on_queue(&q.clone(), "b").build().unwrap();
    q.enqueue(NewTask::new("a", doc! {}).id("ta")).await.unwrap();
    held.hold_next(|c, op| c.as_str() == "jobs" && matches!(op, Op::Claim(_)));
    let ra = tokio::spawn({
        let a = a.clone();
        async move { a.process(|_t: Task| async { true }).await }
    });
    tokio::time::timeout(Duration::from_secs(5), held.reached()).await.expect("a's claim was held");
    let rb = tokio::spawn({
        let b = b.clone();
        async move { b.work(|_t: Task| async { true }).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.shutdown();
    let stopped = tokio::time::timeout(Duration::from_secs(60), rb).await;
    held.open();
    let got = ra.await.unwrap().unwrap();
    assert!(matches!(got, Some(Processed::Completed(_))), "{got:?}");
    assert!(stopped.is_ok(), "b's work() did not return within 60 s of its shutdown (nothing in flight)");
}

/// `limits.rs`: a permit of a task that ended is "handed to the agent's next
/// claim, which comes at once, for at most `PERMIT_REUSE` after its grant";
/// README: "for at most ten seconds, so waiting agents get their turn". A
/// claim that finds its name paused returns before it takes the kept
/// permits: a paused agent keeps its permit of the global concurrency for
/// the whole pause (here 60 s), its lease renewed, and uses it again at the
/// resume however old it is. (The parent commit too.)
#[tokio::test(start_paused = true)]
async fn a_paused_agent_keeps_a_permit_past_its_reuse_bound() {
    use store_trait::{Collection, Query, Store};
    let store = MemoryStore::builder().change_streams(false).build();
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let agent = Agent::on_queue(&q, "w").global_concurrency(1).build().unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(|_t: Task| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    true
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let ctl = Collection::new("jobs_control").unwrap();
    let now = store.now().await.unwrap();
    let held: Vec<String> = store
        .find(&ctl, &Query::all())
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.lease().is_some_and(|l| l.until > now))
        .map(|r| r.key().to_string())
        .collect();
    agent.shutdown();
    let counters = run.await.unwrap().unwrap();
    assert_eq!(counters.tasks_processed, 1, "{counters:?}");
    assert!(held.is_empty(), "60 s into a pause, the paused agent still holds permits {held:?}");
}

/// An idle agent sleeps through other agents' work
/// (`mechanisms::an_idle_agent_sleeps_through_other_agents_work`), but not
/// one with a global concurrency: its subscription is unfiltered ("a task
/// ending anywhere frees a permit: every change wakes it"), so every write
/// to the queue wakes it into a permit command and a claim, here each
/// progress report of another agent name's one running task (100 in 10 s).
/// (The parent commit too.)
#[tokio::test(start_paused = true)]
async fn an_idle_limited_agent_wakes_at_every_progress_report_of_another_name() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let permit_cmds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    held.hold_next({
        let n = permit_cmds.clone();
        move |c, op| {
            if permit_claim(c, op) {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            false
        }
    });
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let idle = Agent::on_queue(&Queue::new(held.clone(), "jobs").unwrap(), "w")
        .global_concurrency(2)
        .poll_interval(Duration::from_secs(600))
        .build()
        .unwrap();
    let idle_run = tokio::spawn({
        let idle = idle.clone();
        async move { idle.work(|_t: Task| async { true }).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = permit_cmds.load(std::sync::atomic::Ordering::SeqCst);
    q.enqueue(NewTask::new("p", doc! {}).id("reporting")).await.unwrap();
    let other = Agent::on_queue(&q, "p").build().unwrap();
    let got = other
        .process(|t: Task| async move {
            for i in 0..100_i64 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                t.progress(i).await.unwrap();
            }
            true
        })
        .await
        .unwrap();
    assert!(matches!(got, Some(Processed::Completed(_))), "{got:?}");
    let woken = permit_cmds.load(std::sync::atomic::Ordering::SeqCst) - before;
    idle.shutdown();
    idle_run.await.unwrap().unwrap();
    assert!(woken <= 3, "the idle agent took {woken} permit commands (and claims) during another name's one task");
}
