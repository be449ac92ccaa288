//! Compiles contract data ([`Condition`], [`Mutation`]) into MongoDB
//! aggregation expressions and pipeline updates (the filters that select
//! documents with them: `filter.rs`).
//!
//! Times are compared as epoch milliseconds (`$toLong` of `$$NOW`): comparing
//! dates against `$$NOW` directly is wrong on some MongoDB-compatible servers,
//! and this form is right on all of them.

use bson::{doc, Bson, Document};
use store_trait::{fields, ChangeFilter, Condition, LeaseOp, Mutation};

fn now_ms() -> Bson {
    Bson::Document(doc! { "$toLong": "$$NOW" })
}

/// The store's time `ms` milliseconds from now, as a BSON date: the sum is
/// taken in epoch milliseconds and converted back. (`$add` of `$$NOW` and a
/// number is MongoDB's own form, but SecantusDB's Rust server rejects an
/// `$add` of a date as a construct it does not support; this form is right
/// on every server.)
fn now_plus(ms: i64) -> Bson {
    if ms == 0 {
        return Bson::String("$$NOW".into());
    }
    Bson::Document(doc! { "$toDate": { "$add": [now_ms(), ms] } })
}

fn field(f: &str) -> Bson {
    Bson::String(format!("${f}"))
}

/// The lease expiry as epoch ms, 0 when missing or null.
fn until_ms() -> Bson {
    Bson::Document(
        doc! { "$convert": { "input": field(fields::LEASE_UNTIL), "to": "long", "onError": 0_i64, "onNull": 0_i64 } },
    )
}

fn counter(f: &str) -> Bson {
    Bson::Document(doc! { "$ifNull": [field(f), 0_i64] })
}

fn is_null_or_missing(f: &str) -> Bson {
    all_null_or_missing(&[f])
}

/// A constant in an aggregation expression: bare when the server can read
/// it as nothing else, else wrapped in `$literal` (a string starting with `$`
/// is a field path or a variable; a document or an array is evaluated). On a
/// server that interprets expressions (SecantusDB), each wrapper is one more
/// node to check and evaluate in every write.
fn constant(v: impl Into<Bson>) -> Bson {
    let v = v.into();
    match &v {
        Bson::String(s) if !s.starts_with('$') => v,
        Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::Double(_)
        | Bson::Decimal128(_)
        | Bson::Boolean(_)
        | Bson::Null
        | Bson::DateTime(_)
        | Bson::ObjectId(_)
        | Bson::Binary(_) => v,
        _ => Bson::Document(doc! { "$literal": v }),
    }
}

/// True when every field of `fs` is null or missing: one chain of `$ifNull`,
/// not a test per field.
fn all_null_or_missing(fs: &[&str]) -> Bson {
    let chain = fs.iter().rev().fold(Bson::Null, |inner, f| Bson::Document(doc! { "$ifNull": [field(f), inner] }));
    Bson::Document(doc! { "$eq": [chain, Bson::Null] })
}

/// The field `c` requires absent, when it is `Not(Exists(field))`.
fn absent_field(c: &Condition) -> Option<&str> {
    match c {
        Condition::Not(c) => match &**c {
            Condition::Exists(f) => Some(f),
            _ => None,
        },
        _ => None,
    }
}

/// The conjunction of `cs`, its absent fields (`Not(Exists)`) tested at once.
pub(crate) fn all(cs: &[Condition]) -> Bson {
    let absent: Vec<&str> = cs.iter().filter_map(absent_field).collect();
    let mut parts: Vec<Bson> = cs.iter().filter(|c| absent_field(c).is_none()).map(condition).collect();
    if !absent.is_empty() {
        parts.push(all_null_or_missing(&absent));
    }
    match parts.len() {
        1 => parts.remove(0),
        _ => Bson::Document(doc! { "$and": parts }),
    }
}

/// Converts an unsigned counter (validated to fit by `Condition::validate`).
pub(crate) fn int(n: u64) -> Bson {
    Bson::Int64(i64::try_from(n).unwrap_or(i64::MAX))
}

/// An aggregation expression that is true exactly when `semantics::eval` is.
pub(crate) fn condition(c: &Condition) -> Bson {
    match c {
        Condition::Always => Bson::Boolean(true),
        Condition::Absent => is_null_or_missing(fields::REV),
        Condition::Free => Bson::Document(doc! {
            "$or": [is_null_or_missing(fields::LEASE_OWNER), { "$lte": [until_ms(), now_ms()] }]
        }),
        Condition::HeldBy(o) => Bson::Document(doc! {
            "$and": [{ "$eq": [field(fields::LEASE_OWNER), constant(o.as_str())] }, { "$gt": [until_ms(), now_ms()] }]
        }),
        Condition::OwnedBy(o) => Bson::Document(doc! { "$eq": [field(fields::LEASE_OWNER), constant(o.as_str())] }),
        Condition::FenceIs(n) => Bson::Document(doc! { "$eq": [counter(fields::FENCE), int(*n)] }),
        Condition::RevIs(n) => Bson::Document(doc! { "$eq": [counter(fields::REV), int(*n)] }),
        // A missing field compares unequal to every value in aggregation `$eq`.
        Condition::FieldEq(f, v) => Bson::Document(doc! { "$eq": [field(f), constant(v.clone())] }),
        Condition::Exists(f) => Bson::Document(doc! { "$not": [is_null_or_missing(f)] }),
        Condition::DueBy(f) => Bson::Document(doc! {
            "$lte": [{ "$convert": { "input": field(f), "to": "long", "onError": 0_i64, "onNull": 0_i64 } }, now_ms()]
        }),
        // Missing or null: true. Numbers compare by value. Anything else: false.
        Condition::AtMost(f, max) => Bson::Document(doc! {
            "$cond": [
                is_null_or_missing(f),
                true,
                { "$and": [
                    { "$in": [{ "$type": field(f) }, ["int", "long", "double", "decimal"]] },
                    { "$lte": [field(f), *max] },
                ] },
            ]
        }),
        Condition::Not(inner) => match absent_field(c) {
            // Absent: the check `Exists` negates, without negating it.
            Some(f) => is_null_or_missing(f),
            None => Bson::Document(doc! { "$not": [condition(inner)] }),
        },
        Condition::All(cs) if cs.is_empty() => Bson::Boolean(true),
        Condition::Any(cs) if cs.is_empty() => Bson::Boolean(false),
        Condition::All(cs) => all(cs),
        Condition::Any(cs) => Bson::Document(doc! { "$or": cs.iter().map(condition).collect::<Vec<_>>() }),
        other => {
            // `Condition` is non-exhaustive for users; every variant is handled above.
            // A future variant this backend does not know must never match.
            tracing::error!(condition = ?other, "condition not understood by the MongoDB backend; treated as false");
            Bson::Boolean(false)
        }
    }
}

fn type_of(f: &str) -> Bson {
    Bson::Document(doc! { "$type": field(f) })
}

fn type_in(f: &str, types: &[&str]) -> Bson {
    Bson::Document(doc! { "$in": [type_of(f), types.iter().map(|t| Bson::String((*t).into())).collect::<Vec<_>>()] })
}

/// True when an integer-like reserved field reads as `Record::from_document`
/// reads it: missing or null, an int or long, a date, or a double with no
/// fraction below 9e15 in magnitude; with `unsigned`, not negative. Branches
/// are `$cond`s, so a conversion only ever sees the type it converts.
fn int_like(f: &str, unsigned: bool) -> Bson {
    // Unsigned: `$gte 0` (so -0.0 reads, as 0); signed: above -9e15. Either way
    // NaN, which compares below every number, fails.
    let low = if unsigned {
        doc! { "$gte": [field(f), 0_i64] }
    } else {
        doc! { "$gt": [field(f), -9.0e15] }
    };
    // Up to `store_trait::MAX_COUNTER`, as a record reads it, whatever the
    // type (a date reads as its milliseconds): a counter a write could not
    // bump without overflowing is unreadable.
    let max = i64::try_from(store_trait::MAX_COUNTER).unwrap_or(i64::MAX);
    let number_ok = if unsigned {
        doc! { "$and": [{ "$gte": [field(f), 0_i64] }, { "$lte": [field(f), max] }] }
    } else {
        doc! { "$literal": true }
    };
    let date_ok = if unsigned {
        doc! { "$and": [{ "$gte": [{ "$toLong": field(f) }, 0_i64] }, { "$lte": [{ "$toLong": field(f) }, max] }] }
    } else {
        doc! { "$literal": true }
    };
    Bson::Document(doc! {
        "$cond": [type_in(f, &["missing", "null"]), true,
            { "$cond": [type_in(f, &["int", "long"]), number_ok,
                { "$cond": [type_in(f, &["date"]), date_ok,
                    { "$cond": [type_in(f, &["double"]),
                        { "$cond": [
                            { "$and": [low, { "$lt": [field(f), 9.0e15] }] },
                            { "$eq": [{ "$trunc": [field(f)] }, field(f)] },
                            false,
                        ] },
                        false,
                    ] },
                ] },
            ] },
        ]
    })
}

/// An aggregation expression that is true exactly when
/// `store_trait::backend::semantics::readable` is: the `_id` is a non-empty string of at
/// most `Key::MAX_LEN` bytes without NUL, an `ObjectId`, an int or a long; the
/// lease owner is missing, null or a string, with an expiry beside it when set;
/// the lease times, fence and revision are integer-like (fence and revision not
/// negative).
pub(crate) fn readable() -> Bson {
    let id = fields::ID;
    let string_id = doc! {
        "$cond": [
            type_in(id, &["string"]),
            { "$and": [
                { "$gte": [{ "$strLenBytes": field(id) }, 1_i64] },
                { "$lte": [{ "$strLenBytes": field(id) }, i64::try_from(store_trait::Key::MAX_LEN).unwrap_or(i64::MAX)] },
                { "$eq": [{ "$indexOfBytes": [field(id), "\0"] }, -1_i64] },
            ] },
            false,
        ]
    };
    let owner = fields::LEASE_OWNER;
    Bson::Document(doc! {
        "$and": [
            { "$or": [type_in(id, &["objectId", "int", "long"]), string_id] },
            type_in(owner, &["missing", "null", "string"]),
            { "$or": [type_in(owner, &["missing", "null"]), { "$not": [type_in(fields::LEASE_UNTIL, &["missing", "null"])] }] },
            int_like(fields::LEASE_SINCE, false),
            int_like(fields::LEASE_UNTIL, false),
            int_like(fields::FENCE, true),
            int_like(fields::REV, true),
        ]
    })
}

/// The `$match` stage of a change stream delivering what `f` lets through
/// (the reference rule: `store_trait::backend::semantics::change_admitted`).
/// An update's `updateDescription.updatedFields` lists the fields whose value
/// changed, `removedFields` those removed.
pub(crate) fn change_match(f: &ChangeFilter) -> Document {
    const SET: &str = "updateDescription.updatedFields";
    // Exact equality of a scalar: never an array holding it (values are
    // scalars, `ChangeFilter::validate`), and `null` only for null, not missing.
    let equal = |v: &Bson| match v {
        Bson::Null => doc! { "$type": "null", "$not": { "$type": "array" } },
        v => doc! { "$eq": v.clone(), "$not": { "$type": "array" } },
    };
    let mut any = vec![Bson::Document(doc! { "operationType": { "$nin": ["insert", "update", "delete"] } })];
    if f.inserts {
        any.push(Bson::Document(doc! { "operationType": "insert" }));
    }
    if f.deletes {
        any.push(Bson::Document(doc! { "operationType": "delete" }));
    }
    for c in &f.updates {
        let mut all = vec![Bson::Document(doc! { "operationType": "update" })];
        for (field, v) in &c.sets {
            all.push(Bson::Document(doc! { format!("{SET}.{field}"): equal(v) }));
        }
        for field in &c.touches {
            all.push(Bson::Document(doc! { "$or": [
                { format!("{SET}.{field}"): { "$exists": true } },
                { "updateDescription.removedFields": field },
            ] }));
        }
        for (field, v) in &c.not_sets {
            all.push(Bson::Document(doc! { "$nor": [{ format!("{SET}.{field}"): equal(v) }] }));
        }
        any.push(Bson::Document(doc! { "$and": all }));
    }
    doc! { "$match": { "$or": any } }
}

/// True when `c` holding rules out a live lease (of anyone): a grant under it
/// starts a new lease, whatever the owner.
fn rules_out_live_lease(c: &Condition) -> bool {
    match c {
        Condition::Free => true,
        Condition::All(cs) => cs.iter().any(rules_out_live_lease),
        _ => false,
    }
}

/// True when `c` holding means `owner` holds a live lease: a grant to `owner`
/// under it renews that lease.
fn holds_live_lease(c: &Condition, owner: &str) -> bool {
    match c {
        Condition::HeldBy(o) => o == owner,
        Condition::All(cs) => cs.iter().any(|c| holds_live_lease(c, owner)),
        _ => false,
    }
}

/// When an update's mutation applies to a document.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Applies<'a> {
    /// When the condition holds: the pipeline evaluates it (a single write,
    /// which returns the document either way).
    When(&'a Condition),
    /// Always: the filter selected the document by this condition (a claim,
    /// a batch's statement), which therefore holds.
    Matched(&'a Condition),
}

/// A pipeline update applying `m` as `applies` says, stamping `nonce` so the
/// caller can tell from the returned document whether it applied.
///
/// The condition is evaluated once: a conditional update is one `$replaceWith`
/// of the document merged with the new values, or the document unchanged
/// (plus, only when the mutation removes fields, a `$set` removing them from a
/// document the first stage marked as written). What the condition says of
/// the lease spares the grant's own comparison. Expressions are kept few: on
/// a server that interprets them (SecantusDB), each costs time in every write.
pub(crate) fn update(applies: Applies<'_>, m: &Mutation, nonce: &str) -> Vec<Document> {
    let (evaluate, holds) = match applies {
        Applies::When(c) => ((*c != Condition::Always).then_some(c), c),
        Applies::Matched(c) => (None, c),
    };
    let mut set = Document::new();
    match &m.lease {
        LeaseOp::Keep => {}
        LeaseOp::Grant { owner, ttl } => {
            // The lease's start: kept when the owner renews its live lease, else now.
            let since = if rules_out_live_lease(holds) {
                now_ms()
            } else if holds_live_lease(holds, owner) {
                Bson::Document(doc! { "$ifNull": [field(fields::LEASE_SINCE), now_ms()] })
            } else {
                let same_live = doc! {
                    "$and": [{ "$eq": [field(fields::LEASE_OWNER), constant(owner.as_str())] }, { "$gt": [until_ms(), now_ms()] }]
                };
                Bson::Document(
                    doc! { "$cond": [same_live, { "$ifNull": [field(fields::LEASE_SINCE), now_ms()] }, now_ms()] },
                )
            };
            set.insert(fields::LEASE_OWNER, constant(owner.as_str()));
            set.insert(fields::LEASE_SINCE, since);
            set.insert(fields::LEASE_UNTIL, doc! { "$add": [now_ms(), ttl.as_millis()] });
        }
        LeaseOp::Release => {
            for f in [fields::LEASE_OWNER, fields::LEASE_SINCE, fields::LEASE_UNTIL] {
                set.insert(f, Bson::Null);
            }
        }
        _ => {}
    }
    // `$add` even without a bump: a fence that is not a number fails the
    // write, whatever it changes.
    set.insert(fields::FENCE, doc! { "$add": [counter(fields::FENCE), i64::from(m.bump_fence)] });
    set.insert(fields::REV, doc! { "$add": [counter(fields::REV), 1_i64] });
    set.insert(fields::LAST_OP, constant(nonce));
    for (k, v) in &m.set {
        set.insert(k, constant(v.clone()));
    }
    for (k, ms) in &m.set_time {
        set.insert(k, now_plus(*ms));
    }
    for (k, by) in &m.inc {
        set.insert(k, doc! { "$add": [{ "$ifNull": [field(k), 0_i64] }, *by] });
    }
    if let Some(ttl) = m.gc {
        set.insert(fields::GC_AT, now_plus(ttl.as_millis()));
    }
    let mut removed: Vec<&str> = m.unset.iter().map(String::as_str).collect();
    if m.clear_gc {
        removed.push(fields::GC_AT);
    }
    let Some(c) = evaluate else {
        for f in removed {
            set.insert(f, "$$REMOVE");
        }
        return vec![doc! { "$set": set }];
    };
    let written = doc! { "$mergeObjects": ["$$ROOT", set] };
    let mut pipeline = vec![doc! { "$replaceWith": { "$cond": [condition(c), written, "$$ROOT"] } }];
    if !removed.is_empty() {
        // Written by the first stage exactly when it stamped this call's
        // nonce: a mark in a field of its own could be set by the document
        // itself (a user's field of that name), and a rejected write would
        // then still remove fields.
        let written = doc! { "$eq": [field(fields::LAST_OP), constant(nonce)] };
        let mut remove = Document::new();
        for f in removed {
            remove.insert(f, doc! { "$cond": [written.clone(), "$$REMOVE", field(f)] });
        }
        pipeline.push(doc! { "$set": remove });
    }
    pipeline
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use store_trait::Ttl;

    #[test]
    fn conditional_update_is_one_stage_and_stamps_nonce() {
        let m = Mutation::new().grant("me", Ttl::new(Duration::from_secs(1)).unwrap()).bump_fence();
        let p = update(Applies::When(&Condition::Free), &m, "n-1");
        assert_eq!(p.len(), 1);
        let branches = p[0].get_document("$replaceWith").unwrap().get_array("$cond").unwrap();
        assert_eq!(branches[2], Bson::String("$$ROOT".into()), "rejected: the document unchanged");
        let merged = branches[1].as_document().unwrap().get_array("$mergeObjects").unwrap();
        let set = merged[1].as_document().unwrap();
        assert!(set.contains_key("lease_owner") && set.contains_key("fence"));
        assert_eq!(set.get_str("last_op").unwrap(), "n-1");
        assert_eq!(update(Applies::Matched(&Condition::Free), &m, "n").len(), 1);
        assert!(update(Applies::When(&Condition::Always), &m, "n")[0].contains_key("$set"), "no condition to evaluate");
    }

    #[test]
    fn removals_under_a_condition_take_a_second_stage() {
        let m = Mutation::new().set("a", 1).unset("b").clear_gc();
        let p = update(Applies::When(&Condition::FenceIs(3)), &m, "n");
        assert_eq!(p.len(), 2);
        let remove = p[1].get_document("$set").unwrap();
        let written = doc! { "$eq": ["$last_op", "n"] };
        assert_eq!(remove.get_document("b").unwrap(), &doc! { "$cond": [written, "$$REMOVE", "$b"] });
        assert!(remove.contains_key(fields::GC_AT));
        assert_eq!(remove.len(), 2, "no marker field of its own");
    }

    /// A grant's start is decided without evaluating the lease when the
    /// condition already did: under `Free` it is now, under `HeldBy` its owner
    /// it is kept.
    #[test]
    fn a_grant_starts_or_keeps_its_lease_as_the_condition_implies() {
        let ttl = Ttl::new(Duration::from_secs(1)).unwrap();
        let since = |c: Condition| {
            let p = update(Applies::When(&c), &Mutation::new().grant("me", ttl), "n");
            let branches = p[0].get_document("$replaceWith").unwrap().get_array("$cond").unwrap().clone();
            let merged = branches[1].as_document().unwrap().get_array("$mergeObjects").unwrap().clone();
            merged[1].as_document().unwrap().get(fields::LEASE_SINCE).cloned().unwrap()
        };
        assert_eq!(since(Condition::Free.and(Condition::Exists("x".into()).negate())), now_ms());
        assert_eq!(
            since(Condition::HeldBy("me".into())),
            Bson::Document(doc! { "$ifNull": [field(fields::LEASE_SINCE), now_ms()] })
        );
        for general in
            [Condition::HeldBy("other".into()), Condition::Free.or(Condition::FenceIs(1)), Condition::FenceIs(1)]
        {
            assert!(since(general).as_document().unwrap().contains_key("$cond"));
        }
        // A claim's update: its filter selected a document without a live lease.
        let claim = Condition::Exists("ready".into()).and(Condition::DueBy("run_at".into())).and(Condition::Free);
        let p = update(Applies::Matched(&claim), &Mutation::new().grant("me", ttl).bump_fence(), "n");
        assert_eq!(p[0].get_document("$set").unwrap().get(fields::LEASE_SINCE), Some(&now_ms()));
    }

    /// A time set on the store clock is `$$NOW` itself, or a sum in epoch
    /// milliseconds made a date: never an `$add` of a date and a number.
    #[test]
    fn times_on_the_store_clock_add_milliseconds_not_dates() {
        let m = Mutation::new()
            .set_now("started_at")
            .set_time_after("retry_at", Duration::from_secs(10))
            .gc_after(Ttl::new(Duration::from_secs(60)).unwrap());
        let p = update(Applies::Matched(&Condition::Always), &m, "n");
        let set = p[0].get_document("$set").unwrap();
        assert_eq!(set.get_str("started_at").unwrap(), "$$NOW");
        let later = |ms: i64| doc! { "$toDate": { "$add": [{ "$toLong": "$$NOW" }, ms] } };
        assert_eq!(set.get_document("retry_at").unwrap(), &later(10_000));
        assert_eq!(set.get_document(fields::GC_AT).unwrap(), &later(60_000));
    }

    #[test]
    fn user_values_are_literals() {
        // A user string starting with '$' must not be read as a field path.
        let m = Mutation::new().set("s", "$lease_owner");
        let p = update(Applies::Matched(&Condition::Always), &m, "n");
        assert_eq!(p[0].get_document("$set").unwrap().get_document("s").unwrap(), &doc! { "$literal": "$lease_owner" });
    }

    #[test]
    fn constants_are_bare_unless_the_server_could_read_them_as_expressions() {
        assert_eq!(constant("a/1"), Bson::String("a/1".into()));
        assert_eq!(constant(7_i64), Bson::Int64(7));
        assert_eq!(constant(Bson::Null), Bson::Null);
        assert_eq!(constant("$x"), Bson::Document(doc! { "$literal": "$x" }));
        assert_eq!(constant(doc! { "$add": [1, 2] }), Bson::Document(doc! { "$literal": { "$add": [1, 2] } }));
        assert_eq!(constant(vec![Bson::Int32(1)]), Bson::Document(doc! { "$literal": [1] }));
    }

    /// A lock's acquire: free, and none of another program's lock fields.
    #[test]
    fn absent_fields_of_a_conjunction_are_tested_at_once() {
        let c = Condition::Free
            .and(Condition::Exists("uuid".into()).negate())
            .and(Condition::Exists("locked".into()).negate());
        let parts = condition(&c).as_document().unwrap().get_array("$and").unwrap().clone();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[1],
            Bson::Document(doc! { "$eq": [{ "$ifNull": ["$uuid", { "$ifNull": ["$locked", null] }] }, null] })
        );
        assert_eq!(condition(&Condition::All(vec![Condition::Free])), condition(&Condition::Free));
    }

    #[test]
    fn empty_combinators() {
        assert_eq!(condition(&Condition::Any(vec![])), Bson::Boolean(false));
        assert_eq!(condition(&Condition::All(vec![])), Bson::Boolean(true));
    }
}
