//! The filters that select documents: a find's ([`query`]), a claim's
//! ([`claim`]: readable documents only), a condition's ([`select`]: plain
//! equalities as query operators, the rest as one `$expr`), and the order of
//! a query ([`sort`]).

use bson::{doc, Bson, Document};
use store_trait::{fields, Condition, Query};

use crate::compile::{all, int, readable};

/// A find filter: the query's equality fields and keys, and its condition
/// ([`select`]).
pub(crate) fn query(q: &Query) -> Document {
    let mut f = keyed(q);
    select(&mut f, &q.condition, None);
    f
}

/// The query's equality fields, and its keys as an `_id` `$in` (served by the
/// `_id` index; beside an `_id` equality, both must hold).
fn keyed(q: &Query) -> Document {
    let mut f = q.filter.clone();
    if let Some(keys) = &q.keys {
        let any_of = doc! { "$in": keys.iter().map(|k| k.as_bson().clone()).collect::<Vec<_>>() };
        if f.contains_key(fields::ID) {
            f.insert("$and", vec![doc! { fields::ID: any_of }]);
        } else {
            f.insert(fields::ID, any_of);
        }
    }
    f
}

/// A claim's filter: the query's, and only documents the store can read
/// ([`readable`](crate::compile::readable)). The equality fields stay first, so the index serving them
/// still selects the candidates; the check runs on those alone.
pub(crate) fn claim(q: &Query) -> Document {
    let mut f = keyed(q);
    select(&mut f, &q.condition, Some(readable()));
    f
}

/// Adds to the filter `f` the documents `c` holds for, as
/// [`condition`](crate::compile::condition) evaluates it: each plain equality among its conjuncts
/// ([`as_query`]) as a query operator on its field, the rest, after `first`,
/// as one `$expr`. Why: a filter with an `$expr` costs SecantusDB's Python
/// server time in proportion to the collection, even beside an `_id`
/// equality (a batch of four fenced completions: 27 ms with the fence and
/// owner in an `$expr`, 5.8 ms as query operators, on 400 documents), so the
/// common conditions of writes by key (a fenced completion, an activation)
/// carry none. A field the filter already names keeps its conjunct in the
/// `$expr`, so no equality replaces another.
pub(crate) fn select(f: &mut Document, c: &Condition, first: Option<Bson>) {
    let mut rest: Vec<&Condition> = Vec::new();
    let mut conjuncts = vec![c];
    while let Some(c) = conjuncts.pop() {
        match c {
            Condition::Always => {}
            Condition::All(cs) => conjuncts.extend(cs.iter().rev()),
            c => match as_query(c) {
                Some((name, test)) if !f.contains_key(name) => {
                    f.insert(name, test);
                }
                _ => rest.push(c),
            },
        }
    }
    let rest = (!rest.is_empty()).then(|| all(&rest.into_iter().cloned().collect::<Vec<_>>()));
    let expr = match (first, rest) {
        (None, None) => return,
        (Some(e), None) | (None, Some(e)) => e,
        (Some(a), Some(b)) => Bson::Document(doc! { "$and": [a, b] }),
    };
    f.insert("$expr", expr);
}

/// A conjunct as a query operator on one field, when the query language
/// decides it exactly as the aggregation's `$eq` in [`condition`](crate::compile::condition)
/// does: a top-level field equal to a string, a boolean or an integer
/// (numbers by value across types, as the query's `$eq`; never an array
/// holding the value, which the query's `$eq` would match). A counter equal
/// to 0 stays an expression: a missing, null or `undefined` counter reads as
/// 0 there, and since MongoDB 8.0 no query operator matches `undefined`
/// (`store-mongo/tests/it/filters.rs` holds both forms to each other).
fn as_query(c: &Condition) -> Option<(&str, Document)> {
    let not_array = doc! { "$type": "array" };
    let equal = |v: Bson| doc! { "$eq": v, "$not": not_array.clone() };
    match c {
        Condition::OwnedBy(o) => Some((fields::LEASE_OWNER, equal(Bson::String(o.clone())))),
        Condition::FenceIs(n) if *n > 0 => Some((fields::FENCE, equal(int(*n)))),
        Condition::RevIs(n) if *n > 0 => Some((fields::REV, equal(int(*n)))),
        Condition::FieldEq(name, v) if !name.contains('.') && !name.starts_with('$') && name != fields::ID => match v {
            Bson::String(_) | Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) => {
                Some((name.as_str(), equal(v.clone())))
            }
            _ => None,
        },
        _ => None,
    }
}

/// A sort document.
pub(crate) fn sort(q: &Query) -> Option<Document> {
    if q.sort.is_empty() {
        return None;
    }
    Some(q.sort.iter().map(|(f, o)| (f.clone(), Bson::Int32(o.as_i32()))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fenced write by key (a completion: owner and fence) carries no
    /// `$expr`; a condition on the clock keeps one; a field the filter names
    /// already is never overwritten.
    #[test]
    fn plain_equalities_select_as_query_operators() {
        let mut f = doc! { "_id": "k" };
        select(&mut f, &Condition::OwnedBy("w".into()).and(Condition::FenceIs(3)), None);
        let not_array = doc! { "$type": "array" };
        assert_eq!(
            f,
            doc! {
                "_id": "k",
                "lease_owner": { "$eq": "w", "$not": not_array.clone() },
                "fence": { "$eq": 3_i64, "$not": not_array.clone() },
            }
        );
        let mut f = doc! { "fence": 1 };
        select(&mut f, &Condition::FenceIs(2).and(Condition::Free).and(Condition::RevIs(4)), None);
        assert_eq!(f.get_i32("fence").unwrap(), 1, "the filter's own equality stays");
        assert_eq!(f.get_document("rev").unwrap(), &doc! { "$eq": 4_i64, "$not": not_array });
        let expr = f.get_document("$expr").unwrap().get_array("$and").unwrap();
        assert_eq!(expr.len(), 2, "the fence and the lease's clock: {expr:?}");
        let mut f = Document::new();
        select(&mut f, &Condition::FenceIs(0), None);
        assert_eq!(f.keys().collect::<Vec<_>>(), ["$expr"], "a counter of 0 may be missing or undefined");
        let mut f = Document::new();
        select(&mut f, &Condition::FieldEq("a.b".into(), Bson::Int32(1)), Some(readable()));
        assert_eq!(f.keys().collect::<Vec<_>>(), ["$expr"], "a dotted path reads arrays its own way");
        let mut f = Document::new();
        select(&mut f, &Condition::Always, None);
        assert!(f.is_empty());
    }

    #[test]
    fn a_query_without_a_condition_has_no_expr() {
        assert!(!query(&Query::all()).contains_key("$expr"));
    }
}
