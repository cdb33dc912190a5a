//! Properties of sharding: a key's shard never moves, and replicas that follow the balancing
//! rule never hold more than their fair share while every shard finds exactly one owner.

use proptest::prelude::*;
use std::collections::BTreeSet;
use vigil_engine::shard::{MAX_SHARDS, balance, fair_share, shard_of};

proptest! {
    #[test]
    fn a_key_maps_to_one_shard_forever(key in ".{0,40}", n in 1u32..=MAX_SHARDS) {
        let s = shard_of(&key, n);
        prop_assert!(s < n);
        prop_assert_eq!(s, shard_of(&key.clone(), n));
    }

    /// Replicas that start with any holdings (say one held everything before the others
    /// joined), give back per the rule, then take free shards in turn: afterwards every shard
    /// has one owner and no replica exceeds `ceil(N / live)`.
    #[test]
    fn healthy_replicas_never_exceed_their_fair_share(
        n in 1u32..=64,
        live in 1usize..=8,
        start in proptest::collection::vec(0usize..8, 0..64),
    ) {
        let mut owner: Vec<Option<usize>> = (0..n).map(|i| start.get(i as usize).map(|r| r % live)).collect();
        for _round in 0..3 {
            for r in 0..live {
                let held: BTreeSet<u32> = (0..n).filter(|i| owner[*i as usize] == Some(r)).collect();
                let b = balance(n, live, &held);
                for s in &b.give_back {
                    owner[*s as usize] = None;
                }
                let mut left = b.may_take;
                for o in owner.iter_mut() {
                    if left == 0 { break; }
                    if o.is_none() { *o = Some(r); left -= 1; }
                }
            }
        }
        for r in 0..live {
            let count = owner.iter().filter(|o| **o == Some(r)).count();
            prop_assert!(count <= fair_share(n, live), "replica {r} holds {count}");
        }
        prop_assert!(owner.iter().all(Option::is_some), "a shard without an owner: {owner:?}");
    }
}
