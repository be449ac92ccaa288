//! The compiled writes against the reference: random documents, conditions
//! and mutations, each written through the server and computed by
//! `store_trait::backend::semantics` (which the in-memory store runs). The
//! outcome and the document after it must agree, field by field, so a
//! compilation that evaluates a condition or a mutation differently from the
//! reference fails here, whatever form the pipeline takes: a single write's
//! (the condition inside the update) or a batch's (the condition in the
//! statement's filter).

use std::time::Duration;

use bson::{doc, Bson, Document};
use store_test::mongo::test_store;
use store_trait::backend::semantics;
use store_trait::{
    fields, BatchOutcome, Collection, Condition, Key, Mutation, Store, StoreTime, Ttl, Write, WriteOutcome,
};

/// Times this far from now: far enough that the few milliseconds between the
/// server's clock reading and the write never flip a comparison.
const FAR_MS: i64 = 3_600_000;

fn pick<T: Clone>(rng: &mut fastrand::Rng, options: &[T]) -> T {
    options[rng.usize(..options.len())].clone()
}

/// A document as programs leave them: leased or not, counters present or
/// missing, data fields of several types.
fn random_doc(rng: &mut fastrand::Rng, key: &str, now: i64) -> Document {
    let mut d = doc! { "_id": key };
    match rng.u8(..3) {
        0 => {}
        1 => {
            d.insert(fields::LEASE_OWNER, Bson::Null);
        }
        _ => {
            let until = now + pick(rng, &[-FAR_MS, FAR_MS]);
            d.insert(fields::LEASE_OWNER, pick(rng, &["a", "b"]));
            d.insert(fields::LEASE_SINCE, until - 2 * FAR_MS);
            d.insert(fields::LEASE_UNTIL, until);
        }
    }
    for f in [fields::FENCE, fields::REV] {
        match rng.u8(..6) {
            0 => {}
            1 => {
                d.insert(f, rng.i32(0..4));
            }
            // Readable doubles, which a fence comparison reads by value.
            2 => {
                d.insert(f, pick(rng, &[0.0, -0.0, 1.0, 2.0]));
            }
            3 => {
                d.insert(f, Bson::Null);
            }
            _ => {
                d.insert(f, rng.i64(0..4));
            }
        }
    }
    let x: Option<Bson> = pick(
        rng,
        &[
            None,
            Some(Bson::Int32(1)),
            Some(Bson::String("s".into())),
            Some(Bson::String("$s".into())),
            Some(Bson::Null),
            Some(Bson::Array(vec![Bson::Null])),
            // What a query's `$eq` matches and the aggregation's does not
            // (an array holding the value), or both by value across types.
            Some(Bson::Array(vec![Bson::Int32(1)])),
            Some(Bson::Array(vec![Bson::String("s".into())])),
            Some(Bson::Double(1.0)),
            Some(Bson::Int64(1)),
            Some(Bson::Boolean(true)),
            Some(Bson::Document(doc! { "s": 1 })),
        ],
    );
    if let Some(x) = x {
        d.insert("x", x);
    }
    if rng.bool() {
        d.insert("y", true);
    }
    match rng.u8(..3) {
        0 => {}
        1 => {
            d.insert("due", now + pick(rng, &[-FAR_MS, FAR_MS]));
        }
        _ => {
            d.insert("due", bson::DateTime::from_millis(now + pick(rng, &[-FAR_MS, FAR_MS])));
        }
    }
    let n: Option<Bson> =
        pick(rng, &[None, Some(Bson::Int32(3)), Some(Bson::Double(9.5)), Some(Bson::String("n".into()))]);
    if let Some(n) = n {
        d.insert("n", n);
    }
    if rng.bool() {
        d.insert(fields::GC_AT, bson::DateTime::from_millis(now + FAR_MS));
    }
    d
}

fn random_condition(rng: &mut fastrand::Rng, depth: u8) -> Condition {
    let leaves = 11;
    let nodes = if depth == 0 { 0 } else { 4 };
    match rng.u8(..leaves + nodes) {
        0 => Condition::Always,
        1 => Condition::Absent,
        2 => Condition::Free,
        3 => Condition::HeldBy(pick(rng, &["a", "b"]).into()),
        4 => Condition::OwnedBy(pick(rng, &["a", "b"]).into()),
        5 => Condition::FenceIs(rng.u64(0..4)),
        6 => Condition::RevIs(rng.u64(0..4)),
        7 => Condition::FieldEq(
            "x".into(),
            pick(
                rng,
                &[
                    Bson::Int32(1),
                    Bson::Int64(1),
                    Bson::Boolean(true),
                    Bson::String("s".into()),
                    Bson::String("$s".into()),
                ],
            ),
        ),
        8 => Condition::Exists(pick(rng, &["x", "y"]).into()),
        9 => Condition::DueBy("due".into()),
        10 => Condition::AtMost("n".into(), 5),
        11 => Condition::Not(Box::new(random_condition(rng, depth - 1))),
        12 => Condition::All((0..rng.usize(0..4)).map(|_| random_condition(rng, depth - 1)).collect()),
        // Fields that must be absent beside another condition, as a lock's
        // acquire has them (the backend tests them at once).
        13 => Condition::All(vec![
            random_condition(rng, depth - 1),
            Condition::Exists(pick(rng, &["x", "y", "z"]).into()).negate(),
            Condition::Exists(pick(rng, &["x", "y", "z"]).into()).negate(),
        ]),
        _ => Condition::Any((0..rng.usize(0..4)).map(|_| random_condition(rng, depth - 1)).collect()),
    }
}

fn random_mutation(rng: &mut fastrand::Rng) -> Mutation {
    let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
    let mut m = match rng.u8(..3) {
        0 => Mutation::new(),
        1 => Mutation::new().grant(pick(rng, &["a", "b"]), ttl),
        _ => Mutation::new().release(),
    };
    if rng.bool() {
        m = m.bump_fence();
    }
    match rng.u8(..3) {
        0 => m = m.set("x", pick(rng, &[Bson::Int32(2), Bson::String("t".into()), Bson::String("$t".into())])),
        1 => m = m.unset("x"),
        _ => {}
    }
    if rng.bool() {
        m = m.unset("y");
    }
    if rng.bool() {
        m = m.set_time_after("t_at", Duration::from_millis(pick(rng, &[0, 5000])));
    }
    if rng.u8(..3) == 0 {
        m = m.inc("n", 2);
    }
    match rng.u8(..3) {
        0 => m = m.gc_after(ttl),
        1 => m = m.clear_gc(),
        _ => {}
    }
    m
}

/// A write's outcome, from `write` or from a batch of one.
#[derive(Debug)]
enum Got {
    Applied,
    /// Rejected, with the current document or without (none exists).
    Rejected(bool),
}

/// Times set from the store's clock may differ by the moments between reading
/// it and writing; everything else must be equal as MongoDB's `$eq` has it.
fn same_fields(got: &Document, want: &Document) -> Result<(), String> {
    let timed = [fields::LEASE_SINCE, fields::LEASE_UNTIL, fields::GC_AT, "t_at"];
    for k in got.keys().chain(want.keys()) {
        if k == fields::LAST_OP {
            continue;
        }
        let (g, w) = (got.get(k), want.get(k));
        let ok = match (g, w) {
            // Of the same BSON type, and within ten seconds of each other.
            (Some(g), Some(w)) if timed.contains(&k.as_str()) => match (semantics::as_i64(g), semantics::as_i64(w)) {
                (Some(gm), Some(wm)) => {
                    (gm - wm).abs() < 10_000 && std::mem::discriminant(g) == std::mem::discriminant(w)
                }
                _ => g == w,
            },
            (Some(g), Some(w)) => semantics::value_eq(g, w),
            (None, None) => true,
            _ => false,
        };
        if !ok {
            return Err(format!("field {k}: server {g:?}, reference {w:?}"));
        }
    }
    Ok(())
}

/// 400 random cases (seed `REFERENCE_SEED`, else a fixed one): every write's
/// outcome and resulting document agree with the reference semantics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_agree_with_the_reference_semantics() {
    let test = "conditional_writes_agree_with_the_reference_semantics";
    let Some(store) = test_store(test).await else { return };
    let seed = std::env::var("REFERENCE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_201_u64);
    let mut rng = fastrand::Rng::with_seed(seed);
    let c = Collection::new("reference").unwrap();
    let raw = store.database().collection::<Document>("reference");
    let (mut applied, mut rejected, mut errors) = (0, 0, 0);
    for case in 0..400 {
        let name = format!("k{case}");
        let key = Key::new(name.as_str()).unwrap();
        let now = store.now().await.unwrap();
        let existing = (rng.u8(..8) != 0).then(|| random_doc(&mut rng, &name, now.as_millis()));
        if let Some(d) = &existing {
            raw.insert_one(d.clone()).await.unwrap();
        }
        let condition = random_condition(&mut rng, 2);
        let mutation = random_mutation(&mut rng);
        let mut write = Write::new(condition.clone(), mutation.clone());
        if semantics::eval(&condition, None, StoreTime::from_millis(0)) && (existing.is_none() || rng.bool()) {
            write = write.upsert();
        }
        let what =
            format!("case {case} (seed {seed}): {existing:?}\n{condition:?}\n{mutation:?} upsert {}", write.upsert);
        if write.validate().is_err() {
            continue;
        }
        let now = store.now().await.unwrap();
        let applies = semantics::eval(&condition, existing.as_ref(), now);
        // A missing document is created only by an upsert, whose condition
        // holds for it.
        let creates_or_applies = if existing.is_some() { applies } else { write.upsert };
        let reference = creates_or_applies.then(|| semantics::apply(existing.as_ref(), &key, &mutation, now, ""));
        // Half the writes that create nothing go as a batch of one (the
        // condition in the statement's filter, the mutation unconditional).
        let batched = !write.upsert && rng.bool();
        let outcome = if batched {
            store.write_many(&c, &[(key.clone(), write.clone())]).await.map(|mut out| match out.pop() {
                Some(BatchOutcome::Applied) => Got::Applied,
                Some(BatchOutcome::Rejected(current)) => Got::Rejected(current.is_some()),
                other => panic!("a batch of one reported {other:?}: {what}"),
            })
        } else {
            store.write(&c, &key, &write).await.map(|out| match out {
                WriteOutcome::Applied(_) => Got::Applied,
                WriteOutcome::Rejected(current) => Got::Rejected(current.is_some()),
            })
        };
        let what = format!("{what} batched {batched}");
        let after = raw.find_one(doc! { "_id": &name }).await.unwrap();
        match (outcome, reference) {
            (Ok(Got::Applied), Some(Ok(want))) => {
                assert!(applies, "applied, the reference rejects: {what}");
                let got = after.expect("an applied write leaves its document");
                same_fields(&got, &want).unwrap_or_else(|e| panic!("{e}: {what}"));
                applied += 1;
            }
            (Ok(Got::Rejected(current)), None) => {
                assert_eq!(after, existing, "a rejected write changed the document: {what}");
                assert_eq!(current, existing.is_some(), "rejected with the wrong document: {what}");
                rejected += 1;
            }
            // Both refuse the mutation (an increment of a string).
            (Err(_), Some(Err(_))) => {
                assert_eq!(after, existing, "a failed write changed the document: {what}");
                errors += 1;
            }
            (got, want) => panic!("server {got:?}, reference {want:?}: {what}"),
        }
    }
    // The cases cover each outcome, or the test shows little.
    assert!(applied > 50 && rejected > 50 && errors > 5, "applied {applied}, rejected {rejected}, errors {errors}");
}
