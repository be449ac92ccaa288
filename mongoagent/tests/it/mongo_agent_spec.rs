//! The Ruby `mongo_agent` gem's own spec (`dmlond/mongo_agent`,
//! `spec/mongo_agent_spec.rb` at `fe8b45d`), ported one example to one test,
//! on every backend (#31). Each test quotes the `it "..."` it ports, and its
//! name is the example's contexts and text.
//!
//! The spec's fixtures, mapped:
//! - `MongoAgent::Agent.new({name:, queue:})` (its `subject`) is
//!   [`Agent::builder`]`(store, name, queue).build()` with the defaults;
//!   `MongoAgent::Error` is [`AgentError`].
//! - `@db[test_agent_queue].insert(...)` writes documents past the agent, as
//!   another program (Moped) does: [`Harness::insert_raw`], each with an
//!   `ObjectId` `_id` as the Ruby driver gives it. No `priority`, no store
//!   fields: the seed's task shape.
//! - `process! { |task| ... }` is [`Agent::process`], `work!` is
//!   [`Agent::work`] with `process_while` set on the builder, `get_tasks` is
//!   [`Agent::get_tasks`] (over [`Queue::tasks`]), `log` is
//!   [`Agent::counters`], `sleep_between` is the poll interval.
//! - What the block returns (the README's migration table): `true` is
//!   [`Outcome::done`], `[true, update]` is [`Outcome::done_with`]`(update)`,
//!   `false` fails the task for good at once (`Outcome::from(false)`, whatever
//!   `max_attempts` says), `[false, update]` is `Outcome::from(false).merge(update)`.
//! - `Socket.gethostname` is the host of [`Identity::current`] (the same
//!   `gethostname(2)`).
//! - `@db[test_agent_queue].find({...}).first` is [`Queue::tasks`] with that
//!   equality filter; the spec drops the database after each example, and each
//!   test here has a store of its own.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use mongoagent::{Agent, AgentError, Outcome, Processed, Queue, Task};
use mongolock::Identity;
use store_test::Harness;
use store_trait::Collection;

/// `let (:test_agent_name)`.
const TEST_AGENT_NAME: &str = "test_agent";

/// `let (:test_agent_queue)`.
const TEST_AGENT_QUEUE: &str = "testqueue";

/// `let (:test_agent_sleep_between)` (seconds).
const TEST_AGENT_SLEEP_BETWEEN: Duration = Duration::from_secs(10);

/// `let (:expected_default_sleep_between)` (seconds).
const EXPECTED_DEFAULT_SLEEP_BETWEEN: Duration = Duration::from_secs(5);

/// `let (:test_task_params)`.
const TEST_TASK_PARAMS: [&str; 4] = ["foo", "bar", "baz", "bleb"];

/// A bound on `work!` (which the spec leaves unbounded), far above what it needs.
const WAIT: Duration = Duration::from_secs(60);

/// `let (:expected_hostname) { Socket.gethostname }`.
fn expected_hostname() -> String {
    Identity::current().host().to_owned()
}

/// The spec's `subject`: `MongoAgent::Agent.new({name: test_agent_name, queue: test_agent_queue})`.
fn subject<S: store_trait::Store + Clone>(s: &S) -> Agent<S> {
    Agent::builder(s.clone(), TEST_AGENT_NAME, TEST_AGENT_QUEUE).build().unwrap()
}

/// `@db[test_agent_queue].insert(docs)`: written as given, an `ObjectId` each.
async fn insert<H: Harness>(h: &H, s: &H::Store, docs: Vec<Document>) {
    let coll = Collection::new(TEST_AGENT_QUEUE).unwrap();
    for mut d in docs {
        d.insert("_id", bson::oid::ObjectId::new());
        h.insert_raw(s, &coll, d).await;
    }
}

/// `test_task_params.collect{|param| {agent_name: test_agent_name, test_param: param}}`,
/// with `ready: true` when `ready`.
fn test_tasks(ready: bool) -> Vec<Document> {
    TEST_TASK_PARAMS
        .iter()
        .map(|param| {
            let mut d = doc! { "agent_name": TEST_AGENT_NAME };
            if ready {
                d.insert("ready", true);
            }
            d.insert("test_param", *param);
            d
        })
        .collect()
}

/// `@db[test_agent_queue].find({agent_name: test_agent_name, test_param: processed_param}).first`.
async fn find_first<S: store_trait::Store + Clone>(s: &S, processed_param: &str) -> Option<Document> {
    let q = Queue::new(s.clone(), TEST_AGENT_QUEUE).unwrap();
    let found = q.tasks(doc! { "agent_name": TEST_AGENT_NAME, "test_param": processed_param }, Some(1)).await.unwrap();
    found.into_iter().next().map(|r| r.into_data())
}

/// A `process!` whose block records whether it was called and `task[:test_param]`.
struct Run {
    called: bool,
    processed_param: Option<String>,
    processed: Option<Processed>,
}

async fn process_recording<S: store_trait::Store + Clone>(agent: &Agent<S>, returns: Outcome) -> Run {
    let called = Arc::new(AtomicBool::new(false));
    let processed_param = Arc::new(Mutex::new(None));
    let (c, p) = (called.clone(), processed_param.clone());
    let processed = agent
        .process(move |task: Task| {
            *p.lock().unwrap() = task.data().get_str("test_param").ok().map(str::to_owned);
            c.store(true, Ordering::SeqCst);
            let returns = returns.clone();
            async move { returns }
        })
        .await
        .unwrap();
    let processed_param = processed_param.lock().unwrap().take();
    Run { called: called.load(Ordering::SeqCst), processed_param, processed }
}

/// The four `process!` examples "with ready tasks": the `before (:each)`
/// inserts the four ready tasks, the block returns `returns`; the expectations
/// all four share (the task processed is one of them, the block was called,
/// `tasks_processed` is 1, the task reads `complete: true`, `started_at`,
/// `completed_at`, `ready: false`, `agent_host` this host). Returns the log
/// and the task's document, for the expectations that differ.
async fn process_a_ready_task<H: Harness>(
    h: &H,
    test: &str,
    returns: Outcome,
) -> (mongoagent::AgentCounters, Option<Processed>, Document) {
    let s = h.store(test).await;
    insert(h, &s, test_tasks(true)).await;
    let agent = subject(&s);
    let run = process_recording(&agent, returns).await;
    let processed_param = run.processed_param.expect("expect(processed_param).to be");
    assert!(TEST_TASK_PARAMS.contains(&processed_param.as_str()), "{processed_param}");
    assert!(run.called);
    assert_eq!(agent.counters().tasks_processed, 1);
    let processed_task = find_first(&s, &processed_param).await.expect("expect(processed_task).to be");
    assert_eq!(processed_task.get_bool("complete").ok(), Some(true), "{processed_task}");
    assert!(processed_task.get_datetime("started_at").is_ok(), "{processed_task}");
    assert!(processed_task.get_datetime("completed_at").is_ok(), "{processed_task}");
    assert_eq!(processed_task.get_bool("ready").ok(), Some(false), "{processed_task}");
    assert_eq!(processed_task.get_str("agent_host").ok(), Some(expected_hostname().as_str()), "{processed_task}");
    (agent.counters(), run.processed, processed_task)
}

/// `work!` with `process_while` counting its own calls and saying stop at
/// the fourth (`@attempts += 1; (@attempts < 4)`), and a block that records
/// whether it was called. Returns (called, the calls of `process_while`, the
/// log `work` returned).
async fn work_for_three_attempts<S: store_trait::Store + Clone>(s: &S) -> (bool, u32, mongoagent::AgentCounters) {
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let agent = Agent::builder(s.clone(), TEST_AGENT_NAME, TEST_AGENT_QUEUE)
        .process_while(move |_log| a.fetch_add(1, Ordering::SeqCst) + 1 < 4)
        .build()
        .unwrap();
    let called = Arc::new(AtomicBool::new(false));
    let c = called.clone();
    let log = tokio::time::timeout(
        WAIT,
        agent.work(move |_task: Task| {
            c.store(true, Ordering::SeqCst);
            async { true }
        }),
    )
    .await
    .expect("work! returns once process_while says stop")
    .unwrap();
    assert_eq!(log, agent.counters(), "work returns the log");
    (called.load(Ordering::SeqCst), attempts.load(Ordering::SeqCst), log)
}

/// The `get_tasks` context's fixtures: the four ready tasks and its
/// `error_document`. The Ruby literal names `test_param` twice
/// (`'finished'`, then `'failed_entry'`); a Ruby hash keeps the later value,
/// so the document has `test_param: 'failed_entry'`. Its misspelt
/// `errors_encounterd` is kept: it is just a field.
fn error_document() -> Document {
    doc! {
        "agent_name": TEST_AGENT_NAME,
        "agent_host": "daaedcedddeaaf",
        "test_param": "failed_entry",
        "complete": true,
        "ready": false,
        "errors_encounterd": true,
    }
}

async fn get_tasks_fixtures<H: Harness>(h: &H, test: &str) -> H::Store {
    let s = h.store(test).await;
    insert(h, &s, test_tasks(true)).await;
    insert(h, &s, vec![error_document()]).await;
    s
}

/// The suite (`mongo_agent_spec_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(mongo_agent_spec_suite, crate::mongo_agent_spec::cases)]
pub(crate) mod cases {
    use super::*;

    /// `it "throws MongoAgent::Error without an attributes Hash"`
    /// (`MongoAgent::Agent.new`).
    ///
    /// Cannot map as written: [`Agent::builder`] takes the name and the queue as
    /// arguments, so an agent without them does not compile. The closest is an
    /// agent given neither (both empty), which is refused as a configuration
    /// error ([`AgentError::Config`]) when built.
    pub(crate) async fn initialization_throws_mongo_agent_error_without_an_attributes_hash<H: Harness>(h: &H) {
        let s = h.store("spec_init_no_attributes").await;
        let built = Agent::builder(s.clone(), "", "").build();
        assert!(matches!(built, Err(AgentError::Config(_))), "{built:?}");
    }

    /// `it "throws MongoAgent::Error without attributes[:name]"`
    /// (`MongoAgent::Agent.new({queue: test_agent_queue})`).
    ///
    /// The name is an argument of [`Agent::builder`]; left out, it is the empty
    /// name, refused as [`AgentError::Config`] when built.
    pub(crate) async fn initialization_throws_mongo_agent_error_without_attributes_name<H: Harness>(h: &H) {
        let s = h.store("spec_init_no_name").await;
        let built = Agent::builder(s.clone(), "", TEST_AGENT_QUEUE).build();
        assert!(matches!(built, Err(AgentError::Config(_))), "{built:?}");
    }

    /// `it 'throws MongoAgent::Error without attributes[:queue]'`
    /// (`MongoAgent::Agent.new({ name: test_agent_name })`).
    ///
    /// The queue is an argument of [`Agent::builder`]; left out, it is the empty
    /// collection name, refused as [`AgentError::Config`] when built.
    pub(crate) async fn initialization_throws_mongo_agent_error_without_attributes_queue<H: Harness>(h: &H) {
        let s = h.store("spec_init_no_queue").await;
        let built = Agent::builder(s.clone(), TEST_AGENT_NAME, "").build();
        assert!(matches!(built, Err(AgentError::Config(_))), "{built:?}");
    }

    /// `it 'creates MongoAgent::Agent with default sleep_between when provided a name and queue'`.
    ///
    /// `sleep_between` is [`Agent::poll_interval`] (5 s by default, as the
    /// gem's). It differs by design in what it is: the gem sleeps it after every
    /// `process!` in `work!`, busy or not; an agent here sleeps at most this long
    /// only while idle, and only until a change notification wakes it (a store
    /// with notifications) or a delayed task is due.
    pub(crate) async fn initialization_creates_mongo_agent_agent_with_default_sleep_between_when_provided_a_name_and_queue<
        H: Harness,
    >(
        h: &H,
    ) {
        let s = h.store("spec_init_default_sleep").await;
        let agent = Agent::builder(s.clone(), TEST_AGENT_NAME, TEST_AGENT_QUEUE).build().unwrap();
        assert_eq!(agent.poll_interval(), EXPECTED_DEFAULT_SLEEP_BETWEEN);
        assert_eq!((agent.name(), agent.queue().collection().as_str()), (TEST_AGENT_NAME, TEST_AGENT_QUEUE));
    }

    /// `it 'allows optional attributes[:sleep_between]'`.
    ///
    /// `sleep_between: test_agent_sleep_between` is
    /// [`AgentBuilder::poll_interval`](mongoagent::AgentBuilder::poll_interval)
    /// (a [`Duration`]; the gem's is seconds). What it means differs as in the
    /// example before.
    pub(crate) async fn initialization_allows_optional_attributes_sleep_between<H: Harness>(h: &H) {
        let s = h.store("spec_init_sleep_between").await;
        let agent = Agent::builder(s.clone(), TEST_AGENT_NAME, TEST_AGENT_QUEUE)
            .poll_interval(TEST_AGENT_SLEEP_BETWEEN)
            .build()
            .unwrap();
        assert_eq!(agent.poll_interval(), TEST_AGENT_SLEEP_BETWEEN);
    }

    /// `process!`, "with no tasks in queue": `it 'returns without processing any tasks'`.
    ///
    /// [`Agent::process`] returns `Ok(None)` (the gem returns `nil`, after a
    /// line on stderr).
    pub(crate) async fn process_with_no_tasks_in_queue_returns_without_processing_any_tasks<H: Harness>(h: &H) {
        let s = h.store("spec_process_no_tasks").await;
        let agent = subject(&s);
        let run = process_recording(&agent, Outcome::done()).await;
        assert!(!run.called);
        assert_eq!(run.processed, None);
        let log = agent.counters();
        assert_eq!((log.tasks_processed, log.failed_tasks), (0, 0));
    }

    /// `process!`, "with no ready tasks in queue": `it 'return without processing any tasks'`.
    ///
    /// The four tasks have an `agent_name` and no `ready` field: none is
    /// claimed, and none is changed.
    pub(crate) async fn process_with_no_ready_tasks_in_queue_return_without_processing_any_tasks<H: Harness>(h: &H) {
        let s = h.store("spec_process_no_ready").await;
        insert(h, &s, test_tasks(false)).await;
        let agent = subject(&s);
        let run = process_recording(&agent, Outcome::done()).await;
        assert!(!run.called);
        assert_eq!(run.processed, None);
        let log = agent.counters();
        assert_eq!((log.tasks_processed, log.failed_tasks), (0, 0));
        for param in TEST_TASK_PARAMS {
            let d = find_first(&s, param).await.unwrap();
            assert!(d.get("ready").is_none() && d.get("complete").is_none() && d.get("agent_host").is_none(), "{d}");
        }
    }

    /// `process!`, "with ready tasks", "success", "default":
    /// `it 'updates complete, started_at, completed_at, and agent_host but not :error_encountered'`.
    ///
    /// The block's `true` completes the task: `complete: true,
    /// error_encountered: false`, `ready: false`, both times and the host.
    pub(crate) async fn process_with_ready_tasks_success_default_updates_complete_started_at_completed_at_and_agent_host_but_not_error_encountered<
        H: Harness,
    >(
        h: &H,
    ) {
        let (log, processed, task) = process_a_ready_task(h, "spec_process_success", true.into()).await;
        assert_eq!(log.failed_tasks, 0);
        assert!(matches!(processed, Some(Processed::Completed(_))), "{processed:?}");
        assert_eq!(task.get_bool("error_encountered").ok(), Some(false), "{task}");
    }

    /// `process!`, "with ready tasks", "success", "with update":
    /// `it 'updates complete, started_at, completed_at, agent_host, and update params, but not error_encountered'`.
    ///
    /// The block's `[true, {test_update: 'updated'}]` is
    /// `Outcome::done_with(doc! {"test_update": "updated"})`.
    pub(crate) async fn process_with_ready_tasks_success_with_update_updates_complete_started_at_completed_at_agent_host_and_update_params_but_not_error_encountered<
        H: Harness,
    >(
        h: &H,
    ) {
        let update = Outcome::done_with(doc! { "test_update": "updated" });
        let (log, processed, task) = process_a_ready_task(h, "spec_process_success_update", update).await;
        assert_eq!(log.failed_tasks, 0);
        assert!(matches!(processed, Some(Processed::Completed(_))), "{processed:?}");
        assert_eq!(task.get_bool("error_encountered").ok(), Some(false), "{task}");
        assert_eq!(task.get_str("test_update").ok(), Some("updated"), "{task}");
    }

    /// `process!`, "with ready tasks", "failure", "default":
    /// `it 'updates complete, started_at, completed_at, agent_host, and error_encountered'`.
    ///
    /// The block's `false` fails the task for good at once (`complete: true,
    /// error_encountered: true`), as the gem's `fail_entry` does, though the
    /// agent's default `max_attempts` is 5: a `false` is never retried (return
    /// `Outcome::failed` for that). Beyond the gem, the task also records why,
    /// `last_error: "the handler reported failure"`.
    pub(crate) async fn process_with_ready_tasks_failure_default_updates_complete_started_at_completed_at_agent_host_and_error_encountered<
        H: Harness,
    >(
        h: &H,
    ) {
        let (log, processed, task) = process_a_ready_task(h, "spec_process_failure", false.into()).await;
        assert_eq!(log.failed_tasks, 1);
        assert!(matches!(processed, Some(Processed::Failed(_))), "failed for good: {processed:?}");
        assert_eq!(task.get_bool("error_encountered").ok(), Some(true), "{task}");
        assert_eq!(task.get_str("last_error").ok(), Some("the handler reported failure"), "{task}");
    }

    /// `process!`, "with ready tasks", "failure", "with update":
    /// `it 'updates complete, started_at, completed_at, agent_host, update params, and error_encountered'`.
    ///
    /// The block's `[false, {test_update: 'updated'}]` is
    /// `Outcome::from(false).merge(doc! {"test_update": "updated"})`: failed for
    /// good at once, with the update merged (as the gem merges it whatever the
    /// success), and `last_error` as in the example before.
    pub(crate) async fn process_with_ready_tasks_failure_with_update_updates_complete_started_at_completed_at_agent_host_update_params_and_error_encountered<
        H: Harness,
    >(
        h: &H,
    ) {
        let update = Outcome::from(false).merge(doc! { "test_update": "updated" });
        let (log, processed, task) = process_a_ready_task(h, "spec_process_failure_update", update).await;
        assert_eq!(log.failed_tasks, 1);
        assert!(matches!(processed, Some(Processed::Failed(_))), "failed for good: {processed:?}");
        assert_eq!(task.get_bool("error_encountered").ok(), Some(true), "{task}");
        assert_eq!(task.get_str("test_update").ok(), Some("updated"), "{task}");
        assert_eq!(task.get_str("last_error").ok(), Some("the handler reported failure"), "{task}");
    }

    /// `work!`, "with no tasks in queue": `it 'returns without processing any tasks'`.
    ///
    /// `process_while` is called before each claim, with the log, as the gem
    /// calls it before each `process!`; it says stop at its fourth call, and
    /// [`Agent::work`] returns the log. The loop differs by design: the gem
    /// sleeps `sleep_between` after every `process!` (three claims, 15 s);
    /// an agent here claims, opens its change subscription and claims again,
    /// claims once more, then idles for at most the poll interval (5 s; until a
    /// change notification or a due time, on a store that has them) before the
    /// fourth call.
    pub(crate) async fn work_with_no_tasks_in_queue_returns_without_processing_any_tasks<H: Harness>(h: &H) {
        let s = h.store("spec_work_no_tasks").await;
        let (called, attempts, log) = work_for_three_attempts(&s).await;
        assert!(!called);
        assert_eq!(attempts, 4, "work! stopped at process_while's first false");
        assert_eq!((log.tasks_processed, log.failed_tasks), (0, 0));
    }

    /// `work!`, "with no ready tasks in queue": `it 'returns without processing any tasks'`.
    ///
    /// As the example before, with the four tasks that have no `ready` field:
    /// none is claimed, and none is changed.
    pub(crate) async fn work_with_no_ready_tasks_in_queue_returns_without_processing_any_tasks<H: Harness>(h: &H) {
        let s = h.store("spec_work_no_ready").await;
        insert(h, &s, test_tasks(false)).await;
        let (called, attempts, log) = work_for_three_attempts(&s).await;
        assert!(!called);
        assert_eq!(attempts, 4, "work! stopped at process_while's first false");
        assert_eq!((log.tasks_processed, log.failed_tasks), (0, 0));
        for param in TEST_TASK_PARAMS {
            let d = find_first(&s, param).await.unwrap();
            assert!(d.get("ready").is_none() && d.get("complete").is_none(), "{d}");
        }
    }

    /// `work!`, "with ready tasks": `it "will process! until process_while returns false"`
    /// (`process_while = -> (log) { (log[:tasks_processed] < 2) }`).
    ///
    /// With the agent's default concurrency of one, exactly two of the four
    /// ready tasks are run and completed; the other two are left ready and
    /// unclaimed (an agent stopped by `process_while` starts no task past it).
    pub(crate) async fn work_with_ready_tasks_will_process_until_process_while_returns_false<H: Harness>(h: &H) {
        let s = h.store("spec_work_ready").await;
        insert(h, &s, test_tasks(true)).await;
        let agent = Agent::builder(s.clone(), TEST_AGENT_NAME, TEST_AGENT_QUEUE)
            .process_while(|log| log.tasks_processed < 2)
            .build()
            .unwrap();
        let called = Arc::new(AtomicU32::new(0));
        let c = called.clone();
        let log = tokio::time::timeout(
            WAIT,
            agent.work(move |_task: Task| {
                c.fetch_add(1, Ordering::SeqCst);
                async { true }
            }),
        )
        .await
        .expect("work! returns once process_while says stop")
        .unwrap();
        assert_eq!(log, agent.counters(), "work returns the log");
        assert_eq!(called.load(Ordering::SeqCst), 2);
        assert!(log.tasks_processed >= 2, "expect(subject.log[:tasks_processed] < 2).to eq(false)");
        assert_eq!(log.tasks_processed, 2);
        assert_eq!(log.failed_tasks, 0);
        let q = Queue::new(s.clone(), TEST_AGENT_QUEUE).unwrap();
        let completed = q.tasks(doc! { "agent_name": TEST_AGENT_NAME, "complete": true }, None).await.unwrap();
        assert_eq!(completed.len(), 2);
        assert_eq!(agent.get_tasks(None).await.unwrap().len(), 2, "the other two are still ready");
    }

    /// `get_tasks`: `it "returns all ready tasks in queue by default"`.
    ///
    /// [`Agent::get_tasks`]`(None)` reads `{agent_name: name, ready: true}`, the
    /// gem's default query: the four ready tasks, not the error document.
    pub(crate) async fn get_tasks_returns_all_ready_tasks_in_queue_by_default<H: Harness>(h: &H) {
        let s = get_tasks_fixtures(h, "spec_get_tasks_default").await;
        let tasks = subject(&s).get_tasks(None).await.unwrap();
        assert_eq!(tasks.len(), TEST_TASK_PARAMS.len());
        for task in &tasks {
            assert_eq!(task.data().get_bool("ready").ok(), Some(true), "{:?}", task.data());
        }
    }

    /// `get_tasks`: `it "return only tasks that match the query provided"`
    /// (`get_tasks({agent_name: test_agent_name, agent_host: error_document[:agent_host]})`).
    ///
    /// [`Agent::get_tasks`]`(Some(filter))`; the filter is field equality (the
    /// gem passes any Mongo query through; ours refuses operators, and this one
    /// has none). Every field of the task read back that the error document
    /// names has the document's value.
    pub(crate) async fn get_tasks_return_only_tasks_that_match_the_query_provided<H: Harness>(h: &H) {
        let s = get_tasks_fixtures(h, "spec_get_tasks_query").await;
        let error_document = error_document();
        let query = doc! { "agent_name": TEST_AGENT_NAME, "agent_host": error_document.get_str("agent_host").unwrap() };
        let tasks = subject(&s).get_tasks(Some(query)).await.unwrap();
        assert_eq!(tasks.len(), 1);
        let returned_task = tasks[0].data();
        let mut compared = 0;
        for (key, value) in returned_task {
            if let Some(expected) = error_document.get(key) {
                assert_eq!(value, expected, "{key}");
                compared += 1;
            }
        }
        assert_eq!(compared, error_document.len(), "every field of the error document was read back: {returned_task}");
    }
}
