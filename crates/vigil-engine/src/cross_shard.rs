//! Overlapping checks in different shards (`vigil run --shards N`): a target selected by checks
//! that live in more than one shard may be started only by the first of them in [`CheckRef`]
//! order; the others treat it as held by that check.
//!
//! Within one replica, two checks selecting the same target are kept apart by claims derived
//! from the objects and by a per-target lock while confirming ([`crate::holders`]). Across
//! replicas there is no shared lock, and each replica reads the other check's claims from its
//! own watch cache, which lags: two replicas could both start on a target failing at once. This
//! rule needs no communication: it reads only which checks select the target and their shards
//! (specs and labels, never status or timing), so every replica reaches the same answer. The
//! cost: while the first check does not start (paused, short-circuited, in dry-run), no other
//! check of another shard starts on that target either; the wait is reported on the waiting
//! check (`WaitingForOtherCheck`), it is never a duplicate.

use crate::holders::Holders;
use crate::target::{CheckRef, Target};
use std::collections::BTreeMap;

/// The checks selecting one target, each with the shard it lives in.
pub type Selecting = Vec<(CheckRef, u32)>;

/// The only check that may start on a target `selecting` select, when the controller runs
/// `shards` shards: the first in [`CheckRef`] order when they live in more than one shard. `None`
/// with one shard, or when they all live in one shard (first come, held by claims, as unsharded).
pub fn first_across_shards(shards: u32, selecting: &[(CheckRef, u32)]) -> Option<&CheckRef> {
    let (_, first_shard) = selecting.first()?;
    let spans_shards = selecting.iter().any(|(_, s)| s != first_shard);
    if shards <= 1 || !spans_shards {
        return None;
    }
    selecting.iter().map(|(c, _)| c).min()
}

/// Leaves each target of `selections` that [`first_across_shards`] gives to one check to that
/// check in `holders`, unless some check holds it already (a started remediation keeps its
/// holder; the rule decides only who may start).
pub fn leave_to_first(mut holders: Holders, shards: u32, selections: &BTreeMap<Target, Selecting>) -> Holders {
    if shards <= 1 {
        return holders;
    }
    for (target, selecting) in selections {
        if let Some(first) = first_across_shards(shards, selecting) {
            holders.leave_to(target.clone(), first.clone());
        }
    }
    holders
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holders::Claim;
    use proptest::prelude::*;

    fn nhc(name: &str) -> CheckRef {
        CheckRef::Node { name: name.into() }
    }

    fn mhc(name: &str) -> CheckRef {
        CheckRef::Machine { namespace: "default".into(), name: name.into() }
    }

    #[test]
    fn who_may_start_table() {
        let (a, b, c) = (nhc("a"), nhc("b"), nhc("c"));
        /// (shards, the checks selecting a target with their shards, who may start, why)
        type Row = (u32, Selecting, Option<CheckRef>, &'static str);
        let table: Vec<Row> = vec![
            (6, vec![(b.clone(), 1), (a.clone(), 0)], Some(a.clone()), "different shards: the first in order"),
            (6, vec![(a.clone(), 3), (b.clone(), 0)], Some(a.clone()), "the order is the checks', not the shards'"),
            (6, vec![(a.clone(), 2), (b.clone(), 2)], None, "same shard: first come, by claims"),
            (1, vec![(a.clone(), 0), (b.clone(), 0)], None, "one shard: unchanged"),
            (1, vec![(a.clone(), 0), (b.clone(), 1)], None, "one shard never applies the rule"),
            (6, vec![(a.clone(), 0)], None, "a single check"),
            (6, vec![], None, "nobody selects it"),
            (6, vec![(c.clone(), 1), (b.clone(), 0), (a.clone(), 0)], Some(a.clone()), "three checks, two shards"),
            (6, vec![(nhc("a"), 1), (mhc("z"), 0)], Some(mhc("z")), "a MachineHealthCheck ranks first"),
        ];
        for (shards, selecting, want, why) in table {
            assert_eq!(first_across_shards(shards, &selecting), want.as_ref(), "{why}");
        }
    }

    #[test]
    fn the_first_holds_an_unclaimed_target_and_a_started_remediation_keeps_its_holder() {
        let (w1, w2) = (Target::local_node("w-1"), Target::local_node("w-2"));
        let both = vec![(nhc("b"), 1), (nhc("a"), 0)];
        let selections: BTreeMap<Target, Selecting> = [(w1.clone(), both.clone()), (w2.clone(), both)].into();
        // b remediates w-2 already (it started before the shards were split, say).
        let claims = vec![Claim { target: w2.clone(), check: nhc("b"), since: None }];
        let holders = leave_to_first(Holders::from_claims(claims.clone()), 6, &selections);
        let h1 = holders.holder(&w1).expect("w-1 left to a");
        assert_eq!((&h1.check, holders.is_left_to_holder(&w1)), (&nhc("a"), true));
        let h2 = holders.holder(&w2).expect("w-2 held by b");
        assert_eq!((&h2.check, holders.is_left_to_holder(&w2)), (&nhc("b"), false));
        // One shard: exactly the holders from claims.
        assert_eq!(leave_to_first(Holders::from_claims(claims.clone()), 1, &selections), Holders::from_claims(claims));
    }

    fn check() -> impl Strategy<Value = CheckRef> {
        prop_oneof![(0u8..4).prop_map(|i| nhc(&format!("n{i}"))), (0u8..3).prop_map(|i| mhc(&format!("m{i}")))]
    }

    proptest! {
        /// Whatever checks select a target and however they are spread over shards, at most one
        /// of them may start on it (no other check holds it for that one), every replica
        /// computes the same one whatever order it lists them in, and checks of one shard are
        /// left to the claims.
        #[test]
        fn at_most_one_check_may_start_on_a_target(
            shards in 1u32..8,
            picked in proptest::collection::btree_map(check(), 0u32..8, 0..7),
            rotate in 0usize..7,
        ) {
            let mut selecting: Vec<(CheckRef, u32)> = picked.into_iter().map(|(c, s)| (c, s % shards)).collect();
            let target = Target::local_node("w");
            let holders = leave_to_first(Holders::none(), shards, &[(target.clone(), selecting.clone())].into());
            let may_start: Vec<&CheckRef> =
                selecting.iter().map(|(c, _)| c).filter(|c| holders.other_than(&target, c).is_none()).collect();
            let spans = selecting.iter().any(|(_, s)| Some(s) != selecting.first().map(|f| &f.1));
            if shards > 1 && spans {
                prop_assert_eq!(may_start.len(), 1, "{:?}", selecting);
            } else {
                prop_assert_eq!(may_start.len(), selecting.len(), "unsharded or one shard: nothing left to anyone");
            }
            let first = first_across_shards(shards, &selecting).cloned();
            if !selecting.is_empty() {
                let n = rotate % selecting.len();
                selecting.rotate_left(n);
            }
            prop_assert_eq!(first_across_shards(shards, &selecting).cloned(), first);
        }
    }
}
