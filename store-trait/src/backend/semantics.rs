//! The reference semantics of the contract, as plain Rust functions.
//!
//! These functions **define** what a [`Condition`], a query filter and a
//! [`Mutation`] mean. The in-memory backend runs them directly; the MongoDB
//! backend compiles the same data into server-side expressions, and the
//! conformance suite checks that both agree.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::{fields, Condition, FaultKind, Key, LeaseOp, Mutation, StoreError, StoreResult, StoreTime};

/// Evaluates `cond` against the current document (`None` when absent) at store
/// time `now`.
pub fn eval(cond: &Condition, doc: Option<&Document>, now: StoreTime) -> bool {
    let get = |f: &str| doc.and_then(|d| d.get(f)).filter(|v| !matches!(v, Bson::Null));
    let owner = || get(fields::LEASE_OWNER).and_then(Bson::as_str);
    let until = || get(fields::LEASE_UNTIL).and_then(as_i64).unwrap_or(0);
    let counter = |f: &str| get(f).and_then(as_i64).unwrap_or(0);
    match cond {
        Condition::Always => true,
        Condition::Absent => get(fields::REV).is_none(),
        Condition::Free => owner().is_none() || until() <= now.as_millis(),
        Condition::HeldBy(o) => owner() == Some(o.as_str()) && until() > now.as_millis(),
        Condition::OwnedBy(o) => owner() == Some(o.as_str()),
        Condition::FenceIs(n) => i64::try_from(*n).is_ok_and(|n| counter(fields::FENCE) == n),
        Condition::RevIs(n) => i64::try_from(*n).is_ok_and(|n| counter(fields::REV) == n),
        Condition::FieldEq(f, v) => doc.and_then(|d| d.get(f)).is_some_and(|x| value_eq(x, v)),
        Condition::Exists(f) => get(f).is_some(),
        Condition::DueBy(f) => due_millis(doc.and_then(|d| d.get(f))) <= now.as_millis(),
        Condition::AtMost(f, max) => match doc.and_then(|d| d.get(f)) {
            None | Some(Bson::Null) => true,
            Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => as_i64(v).is_some_and(|n| n <= *max),
            Some(Bson::Double(x)) => x.is_finite() && *x <= *max as f64,
            Some(_) => false,
        },
        Condition::Not(c) => !eval(c, doc, now),
        Condition::All(cs) => cs.iter().all(|c| eval(c, doc, now)),
        Condition::Any(cs) => cs.iter().any(|c| eval(c, doc, now)),
    }
}

/// Whether a stored document can be read as a [`Record`](crate::Record): its
/// `_id` is a [`Key`] and its reserved fields have the types the store writes.
/// A claim passes over documents that are not (another program's, with a UUID
/// `_id` or a string `fence`), so it never hands out one it cannot read.
pub fn readable(doc: &Document) -> bool {
    crate::Record::from_document("", doc.clone()).is_ok()
}

/// The epoch-milliseconds reading of a "due" field, as MongoDB's
/// `$convert: {to: "long", onError: 0, onNull: 0}` reads it.
fn due_millis(v: Option<&Bson>) -> i64 {
    match v {
        None | Some(Bson::Null) => 0,
        Some(Bson::DateTime(d)) => d.timestamp_millis(),
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(f)) if f.is_finite() && f.abs() < 9.2e18 => *f as i64,
        Some(Bson::Boolean(b)) => i64::from(*b),
        Some(Bson::String(s)) => s.trim().parse().unwrap_or(0),
        Some(_) => 0,
    }
}

/// Reads an integer-like BSON value.
pub fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(*f as i64),
        Bson::DateTime(d) => Some(d.timestamp_millis()),
        _ => None,
    }
}

fn as_f64(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    }
}

/// Equality as MongoDB's aggregation `$eq` has it: numbers compare by value across
/// types, everything else structurally.
pub fn value_eq(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// Whether `doc` matches `query`'s selection (its keys, equality filter and
/// condition) at store time `now`; its sort and limit are not a match's concern.
pub fn query_matches(query: &crate::Query, doc: &Document, now: StoreTime) -> bool {
    let keyed = query
        .keys
        .as_ref()
        .is_none_or(|keys| doc.get(fields::ID).is_some_and(|id| keys.iter().any(|k| value_eq(k.as_bson(), id))));
    keyed && filter_matches(&query.filter, doc) && eval(&query.condition, Some(doc), now)
}

/// Whether `doc` matches an equality `filter` as a MongoDB find filter does:
/// `null` matches a missing field too, and an array field matches a value it
/// contains.
pub fn filter_matches(filter: &Document, doc: &Document) -> bool {
    filter.iter().all(|(k, want)| match (doc.get(k), want) {
        (None | Some(Bson::Null), Bson::Null) => true,
        (None, _) => false,
        (Some(Bson::Array(items)), w) if !matches!(w, Bson::Array(_)) => items.iter().any(|x| value_eq(x, w)),
        (Some(have), w) => value_eq(have, w),
    })
}

fn type_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Null | Bson::Undefined => 1,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 2,
        Bson::Symbol(_) | Bson::String(_) => 3,
        Bson::Document(_) => 4,
        Bson::Array(_) => 5,
        Bson::Binary(_) => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Timestamp(_) => 10,
        Bson::RegularExpression(_) => 11,
        Bson::MaxKey => 13,
        _ => 12,
    }
}

/// Total order over BSON values following MongoDB's comparison order (types
/// first, then values). Missing sorts as null.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let (ra, rb) = (type_rank(a), type_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            as_i64(a).unwrap_or(0).cmp(&as_i64(b).unwrap_or(0))
        }
        _ if ra == 2 => as_f64(a).unwrap_or(f64::NAN).total_cmp(&as_f64(b).unwrap_or(f64::NAN)),
        (Bson::String(x), Bson::String(y)) => x.cmp(y),
        (Bson::Document(x), Bson::Document(y)) => {
            for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
                let o = compare(va, vb).then_with(|| ka.cmp(kb));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Array(x), Bson::Array(y)) => {
            for (va, vb) in x.iter().zip(y.iter()) {
                let o = compare(va, vb);
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => (x.time, x.increment).cmp(&(y.time, y.increment)),
        _ => {
            if a == b {
                Ordering::Equal
            } else {
                format!("{a:?}").cmp(&format!("{b:?}"))
            }
        }
    }
}

/// Applies `m` to the current document (`None` when absent), at store time `now`,
/// stamping `nonce` as the last operation. Returns the new document.
pub fn apply(
    existing: Option<&Document>,
    key: &Key,
    m: &Mutation,
    now: StoreTime,
    nonce: &str,
) -> StoreResult<Document> {
    let mut doc = existing.cloned().unwrap_or_else(|| bson::doc! { fields::ID: key.as_bson().clone() });
    let old = |f: &str| existing.and_then(|d| d.get(f)).filter(|v| !matches!(v, Bson::Null));
    let n = now.as_millis();
    match &m.lease {
        LeaseOp::Keep => {}
        LeaseOp::Grant { owner, ttl } => {
            let same_live = old(fields::LEASE_OWNER).and_then(Bson::as_str) == Some(owner.as_str())
                && old(fields::LEASE_UNTIL).and_then(as_i64).unwrap_or(0) > n;
            let since = if same_live { old(fields::LEASE_SINCE).and_then(as_i64).unwrap_or(n) } else { n };
            doc.insert(fields::LEASE_OWNER, owner.clone());
            doc.insert(fields::LEASE_SINCE, since);
            doc.insert(fields::LEASE_UNTIL, now.plus(*ttl).as_millis());
        }
        LeaseOp::Release => {
            doc.insert(fields::LEASE_OWNER, Bson::Null);
            doc.insert(fields::LEASE_SINCE, Bson::Null);
            doc.insert(fields::LEASE_UNTIL, Bson::Null);
        }
    }
    let counter = |f: &str| old(f).and_then(as_i64).unwrap_or(0);
    doc.insert(fields::FENCE, counter(fields::FENCE) + i64::from(m.bump_fence));
    doc.insert(fields::REV, counter(fields::REV) + 1);
    doc.insert(fields::LAST_OP, nonce);
    for (k, v) in &m.set {
        doc.insert(k.clone(), v.clone());
    }
    for k in &m.unset {
        doc.remove(k);
    }
    for (k, ms) in &m.set_time {
        doc.insert(k.clone(), bson::DateTime::from_millis(n.saturating_add(*ms)));
    }
    for (k, by) in &m.inc {
        let v = match doc.get(k) {
            None | Some(Bson::Null) => Bson::Int64(*by),
            Some(Bson::Int32(i)) => Bson::Int64(i64::from(*i).saturating_add(*by)),
            Some(Bson::Int64(i)) => Bson::Int64(i.saturating_add(*by)),
            Some(Bson::Double(f)) => Bson::Double(f + *by as f64),
            Some(other) => {
                return Err(StoreError::Backend {
                    kind: FaultKind::Permanent,
                    code: Some(14),
                    message: format!("cannot increment field {k:?} holding {other}"),
                    source: None,
                })
            }
        };
        doc.insert(k.clone(), v);
    }
    if let Some(ttl) = m.gc {
        doc.insert(fields::GC_AT, now.plus(ttl).to_bson_datetime());
    }
    if m.clear_gc {
        doc.remove(fields::GC_AT);
    }
    Ok(doc)
}

/// Whether `filter` delivers a change that did `detail`: the reference rule
/// every backend's [`Store::watch_filtered`](crate::Store::watch_filtered) keeps.
///
/// ```
/// use store_trait::backend::semantics::change_admitted;
/// use store_trait::backend::ChangeDetail;
/// use store_trait::{bson::doc, ChangeFilter, UpdateClause};
///
/// let f = ChangeFilter::new().update(UpdateClause::sets("ready", true).unless_sets("complete", true));
/// let made_ready = ChangeDetail::Update { set: doc! { "ready": true }, removed: vec![] };
/// let finished = ChangeDetail::Update { set: doc! { "ready": true, "complete": true }, removed: vec![] };
/// assert!(change_admitted(&f, &made_ready));
/// assert!(!change_admitted(&f, &finished));
/// assert!(!change_admitted(&f, &ChangeDetail::Insert));
/// assert!(change_admitted(&f, &ChangeDetail::Replace));
/// ```
pub fn change_admitted(filter: &crate::ChangeFilter, detail: &super::ChangeDetail) -> bool {
    use super::ChangeDetail;
    match detail {
        ChangeDetail::Insert => filter.inserts,
        ChangeDetail::Delete => filter.deletes,
        ChangeDetail::Replace => true,
        ChangeDetail::Update { set, removed } => filter.updates.iter().any(|c| {
            let sets = |f: &String, v: &Bson| set.get(f).is_some_and(|now| value_eq(now, v));
            c.sets.iter().all(|(f, v)| sets(f, v))
                && c.touches.iter().all(|f| set.contains_key(f) || removed.contains(f))
                && !c.not_sets.iter().any(|(f, v)| sets(f, v))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ttl;
    use bson::doc;
    use std::time::Duration;

    fn t(ms: i64) -> StoreTime {
        StoreTime::from_millis(ms)
    }

    fn check(cond: Condition, doc: Option<Document>, now: i64, expect: bool) {
        assert_eq!(eval(&cond, doc.as_ref(), t(now)), expect, "{cond:?} on {doc:?} at {now}");
    }

    #[test]
    fn lease_conditions() {
        let held = doc! { "_id": "k", "lease_owner": "a", "lease_until": 100_i64, "rev": 1_i64, "fence": 1_i64 };
        check(Condition::Free, None, 0, true);
        check(Condition::Free, Some(held.clone()), 99, false);
        check(Condition::Free, Some(held.clone()), 100, true);
        check(Condition::HeldBy("a".into()), Some(held.clone()), 99, true);
        check(Condition::HeldBy("a".into()), Some(held.clone()), 100, false);
        check(Condition::OwnedBy("a".into()), Some(held.clone()), 100, true);
        check(Condition::HeldBy("b".into()), Some(held.clone()), 0, false);
        check(Condition::Absent, Some(held.clone()), 0, false);
        check(Condition::Absent, Some(doc! {"_id": "x"}), 0, true);
        check(Condition::FenceIs(1), Some(held.clone()), 0, true);
        check(Condition::FenceIs(0), None, 0, true);
        let released = doc! { "_id": "k", "lease_owner": null, "lease_until": null, "rev": 2_i64 };
        check(Condition::Free, Some(released), 0, true);
    }

    #[test]
    fn field_conditions() {
        let d = doc! { "_id": "k", "n": 1_i32, "s": "x", "nul": null, "at": bson::DateTime::from_millis(50), "bad": "soon" };
        check(Condition::FieldEq("n".into(), Bson::Int64(1)), Some(d.clone()), 0, true);
        check(Condition::FieldEq("n".into(), Bson::Double(1.0)), Some(d.clone()), 0, true);
        check(Condition::FieldEq("s".into(), Bson::Int32(1)), Some(d.clone()), 0, false);
        check(Condition::FieldEq("missing".into(), Bson::Int32(1)), Some(d.clone()), 0, false);
        check(Condition::Exists("nul".into()), Some(d.clone()), 0, false);
        check(Condition::Exists("s".into()), Some(d.clone()), 0, true);
        check(Condition::DueBy("at".into()), Some(d.clone()), 49, false);
        check(Condition::DueBy("at".into()), Some(d.clone()), 50, true);
        check(Condition::DueBy("missing".into()), Some(d.clone()), 0, true);
        check(Condition::DueBy("bad".into()), Some(d.clone()), 0, true);
        check(Condition::AtMost("n".into(), 1), Some(d.clone()), 0, true);
        check(Condition::AtMost("n".into(), 0), Some(d.clone()), 0, false);
        check(Condition::AtMost("missing".into(), -5), Some(d.clone()), 0, true);
        check(Condition::AtMost("s".into(), 100), Some(d.clone()), 0, false);
        check(Condition::Any(vec![]), Some(d.clone()), 0, false);
        check(Condition::All(vec![]), Some(d), 0, true);
    }

    #[test]
    fn filters() {
        let d = doc! { "a": 1, "tags": ["x", "y"], "n": null };
        assert!(filter_matches(&doc! { "a": 1_i64 }, &d));
        assert!(filter_matches(&doc! { "tags": "y" }, &d));
        assert!(filter_matches(&doc! { "n": null, "zz": null }, &d));
        assert!(!filter_matches(&doc! { "a": 2 }, &d));
        assert!(!filter_matches(&doc! { "zz": 1 }, &d));
    }

    #[test]
    fn ordering() {
        assert_eq!(compare(&Bson::Null, &Bson::Int32(0)), Ordering::Less);
        assert_eq!(compare(&Bson::Int32(2), &Bson::Double(1.5)), Ordering::Greater);
        assert_eq!(compare(&Bson::String("a".into()), &Bson::Int64(9)), Ordering::Greater);
    }

    #[test]
    fn grant_renew_release() {
        let key = Key::new("k").unwrap();
        let ttl = Ttl::new(Duration::from_millis(10)).unwrap();
        let m = Mutation::new().grant("a", ttl).bump_fence();
        let d1 = apply(None, &key, &m, t(100), "n1").unwrap();
        assert_eq!(
            d1,
            doc! { "_id": "k", "lease_owner": "a", "lease_since": 100_i64, "lease_until": 110_i64, "fence": 1_i64, "rev": 1_i64, "last_op": "n1" }
        );
        let d2 = apply(Some(&d1), &key, &Mutation::new().grant("a", ttl), t(105), "n2").unwrap();
        assert_eq!(d2.get_i64("lease_since").unwrap(), 100, "renewal keeps since");
        assert_eq!(d2.get_i64("fence").unwrap(), 1);
        let d3 = apply(Some(&d2), &key, &Mutation::new().release(), t(106), "n3").unwrap();
        assert_eq!(d3.get("lease_owner"), Some(&Bson::Null));
        assert_eq!(d3.get_i64("fence").unwrap(), 1, "release keeps the fence");
        let d4 = apply(Some(&d3), &key, &Mutation::new().grant("a", ttl).bump_fence(), t(107), "n4").unwrap();
        assert_eq!((d4.get_i64("lease_since").unwrap(), d4.get_i64("fence").unwrap()), (107, 2));
    }

    #[test]
    fn data_changes() {
        let key = Key::new("k").unwrap();
        let m = Mutation::new()
            .set("a", 1)
            .unset("b")
            .set_time_after("at", Duration::from_millis(5))
            .inc("n", 2)
            .inc("m", 1);
        let d = apply(Some(&doc! {"_id": "k", "b": 1, "m": 1_i32}), &key, &m, t(10), "x").unwrap();
        assert_eq!(d.get_i32("a").unwrap(), 1);
        assert!(d.get("b").is_none());
        assert_eq!(d.get_datetime("at").unwrap().timestamp_millis(), 15);
        assert_eq!((d.get_i64("n").unwrap(), d.get_i64("m").unwrap()), (2, 2));
        let bad = apply(Some(&doc! {"_id": "k", "n": "x"}), &key, &Mutation::new().inc("n", 1), t(0), "y");
        assert!(bad.is_err());
    }
}
