//! `mongocoord schedules` and `mongocoord schedule pause|resume|delete` against
//! the real server, on schedules a `mongoagent` scheduler ran.

use std::time::Duration;

use mongoagent::{
    schedule::{Overlap, Schedule, Schedules},
    NewTask,
};
use serde_json::Value;

use crate::env;

#[test]
fn schedules_are_listed_paused_resumed_and_deleted() {
    let Some(e) = env("schedules_view") else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let store = store_mongo::MongoStore::connect(&e.uri, &e.db).await.unwrap();
        let s = Schedules::new(store, "jobs").unwrap();
        let every = Schedule::every("sweep", Duration::from_secs(1), NewTask::new("w", bson::doc! {}))
            .unwrap()
            .overlap(Overlap::Allow);
        s.upsert(&every).await.unwrap();
        let nightly = Schedule::cron("nightly", "0 30 2 * * *", "Europe/Berlin", NewTask::new("w", bson::doc! {}));
        s.upsert(&nightly.unwrap()).await.unwrap();
        let h = s.scheduler().spawn();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        h.stop().await.unwrap();
    });
    let rows = e.json(&["schedules", "--queue", "jobs"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["name"].as_str().unwrap()).collect::<Vec<_>>(), ["nightly", "sweep"]);
    let (nightly, sweep) = (&rows[0], &rows[1]);
    assert_eq!((nightly["spec"].as_str(), nightly["zone"].as_str()), (Some("0 30 2 * * *"), Some("Europe/Berlin")));
    assert!(
        nightly["next_tick"].as_str().unwrap().contains("T01:30:00")
            || nightly["next_tick"].as_str().unwrap().contains("T00:30:00")
    );
    assert_eq!(sweep["spec"], "every 1s");
    assert_eq!(sweep["last_outcome"], "ready", "{sweep}");
    assert!(sweep["last_task"].as_str().unwrap().starts_with("sched/sweep/"));
    assert_eq!(sweep["paused"], false);

    let table = e.run(&["schedules", "--queue", "jobs"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("NAME") && text.contains("Europe/Berlin"), "{text}");

    assert!(e.run(&["schedule", "pause", "sweep", "--queue", "jobs"]).status.success());
    let rows = e.json(&["schedules", "--queue", "jobs"]);
    assert_eq!((rows[1]["paused"].as_bool(), &rows[1]["next_tick"]), (Some(true), &Value::Null));
    assert!(e.run(&["schedule", "resume", "sweep", "--queue", "jobs"]).status.success());
    assert!(e.run(&["schedule", "delete", "sweep", "--queue", "jobs"]).status.success());
    assert_eq!(e.run(&["schedule", "delete", "sweep", "--queue", "jobs"]).status.code(), Some(1));
    assert_eq!(e.json(&["schedules", "--queue", "jobs"]).as_array().unwrap().len(), 1);
}
