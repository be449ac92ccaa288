//! Absurd configuration is a typed error at `build`, never a panic, and never
//! found out only after a task was claimed.

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentError, NewTask, Queue, Task};
use proptest::prelude::*;
use store_memory::MemoryStore;

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_millis(1)),
        (0_u64..=u64::MAX, 0_u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0_u64..100_000).prop_map(Duration::from_millis),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn builder_never_panics(
        lease in duration(), poll in duration(), drain in duration(), base in duration(), max in duration(),
    ) {
        let b = Agent::builder(MemoryStore::new(), "a", "q")
            .ttl(lease)
            .poll_interval(poll)
            .drain_timeout(drain)
            .backoff(base, max);
        if let Err(e) = b.build() {
            prop_assert!(matches!(e, AgentError::Config(_)), "{e}");
        }
    }
}

/// A lease too short to keep (no room for a renewal and the safety margin) is
/// rejected by `build`; before, it was rejected only after the claim had been
/// applied, leaving the task claimed by nobody until the lease lapsed.
#[tokio::test(start_paused = true)]
async fn a_lease_too_short_to_keep_is_rejected_before_any_claim() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "q").unwrap();
    q.enqueue(NewTask::new("a", doc! {}).id("t")).await.unwrap();
    let built = Agent::builder(store.clone(), "a", "q").ttl(Duration::from_millis(3)).build();
    assert!(matches!(built, Err(AgentError::Config(_))), "{built:?}");
    let ok = Agent::builder(store, "a", "q").ttl(Duration::from_secs(1)).build().unwrap();
    assert!(ok.process(|_t: Task| async { true }).await.unwrap().is_some(), "the task was never claimed");
}

/// A configuration error keeps the error that rejected it as its source
/// (an invalid name from the store, a lease from the lock, a cron expression
/// from its parser), and says what it says.
#[test]
fn a_configuration_error_keeps_what_rejected_it() {
    use std::error::Error as _;
    let source = |e: &AgentError| match e {
        AgentError::Config(c) => c.source().map(ToString::to_string),
        other => panic!("not a configuration error: {other}"),
    };
    let e = Queue::new(MemoryStore::new(), "").unwrap_err();
    let AgentError::Config(c) = &e else { panic!("{e}") };
    assert!(c.source().unwrap().downcast_ref::<store_trait::StoreError>().is_some(), "{e}");
    assert_eq!(e.to_string(), format!("invalid agent configuration: {}", c.source().unwrap()));
    let e = Agent::builder(MemoryStore::new(), "a", "q").ttl(Duration::from_millis(3)).build().unwrap_err();
    let AgentError::Config(c) = &e else { panic!("{e}") };
    assert!(c.source().unwrap().downcast_ref::<mongoagent::mongolock::LockError>().is_some(), "{e}");
    let e = mongoagent::schedule::Schedule::cron("n", "61 * * * *", "UTC", NewTask::new("a", doc! {})).unwrap_err();
    assert!(source(&e).is_some_and(|s| e.to_string().contains(&s)), "{e}");
    let e = Agent::builder(MemoryStore::new(), "", "q").build().unwrap_err();
    assert_eq!(source(&e), None, "nothing else rejected an empty name: {e}");
}

/// Rejected at `build` with a typed error.
fn assert_rejected(b: mongoagent::AgentBuilder<MemoryStore>) {
    let built = b.build();
    assert!(matches!(built, Err(AgentError::Config(_))), "{built:?}");
}

/// A backoff whose maximum is below its base is a configuration error at
/// `build`, not a retry delay that silently ignores the base.
#[test]
fn a_backoff_maximum_below_its_base_is_rejected() {
    assert_rejected(
        Agent::builder(MemoryStore::new(), "a", "q").backoff(Duration::from_secs(2), Duration::from_secs(1)),
    );
}

/// A rate limit of no starts is a configuration error at `build`: accepted,
/// the first start would divide by zero (start `k` takes slot `k mod n`).
#[test]
fn a_rate_limit_of_no_starts_is_rejected() {
    assert_rejected(Agent::builder(MemoryStore::new(), "a", "q").rate_limit(0, Duration::from_secs(1)));
}

/// Input that means nothing is refused where it is given: a cron expression
/// of a date that never comes (it parsed, then its scheduler waited for
/// ever), an empty dedupe key, a pause of the empty agent name (no agent
/// has it).
#[tokio::test]
async fn input_that_means_nothing_is_refused() {
    let e = mongoagent::schedule::Schedule::cron("n", "0 0 30 2 *", "UTC", NewTask::new("a", doc! {})).unwrap_err();
    assert!(e.to_string().contains("never fires"), "{e}");
    mongoagent::schedule::Schedule::cron("leap", "0 0 29 2 *", "UTC", NewTask::new("a", doc! {})).unwrap();
    let q = Queue::new(MemoryStore::new(), "q").unwrap();
    let e = q.enqueue(NewTask::new("a", doc! {}).dedupe_key("")).await.unwrap_err();
    assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
    let e = q.set_paused("", true).await.unwrap_err();
    assert!(matches!(e, AgentError::Config(_)), "{e}");
}
