//! Sharding: which shard a check belongs to, and how many shards one replica may hold.
//!
//! A check belongs to one shard by a stable hash of its shard key: a MachineHealthCheck by its
//! workload cluster (`namespace/clusterName`, so a cluster's Machines, Nodes and connection live
//! in one replica), a NodeHealthCheck by its name. The hash is FNV-1a (64 bit), written here:
//! `std::hash` may change between Rust releases, and a shard must not move when the controller
//! is rebuilt. Replicas balance by a fair share: with `live` replicas each holds at most
//! `ceil(shards / live)` and gives back the excess (the highest indexes) when a replica joins.

/// The largest shard count `vigil run --shards` accepts.
pub const MAX_SHARDS: u32 = 1024;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bit: stable across builds and platforms (the shard of a key must never move).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
}

/// The shard key of a MachineHealthCheck: its workload cluster, `namespace/clusterName`.
pub fn machine_check_key(namespace: &str, cluster_name: &str) -> String {
    format!("{namespace}/{cluster_name}")
}

/// The shard of a key among `shards` (0 shards counts as 1: everything is shard 0).
pub fn shard_of(key: &str, shards: u32) -> u32 {
    let n = u64::from(shards.max(1));
    // The remainder is below `shards`, which is a u32.
    u32::try_from(fnv1a(key.as_bytes()) % n).unwrap_or(0)
}

/// How many of `shards` one replica may hold when `live` replicas (itself included) are alive:
/// `ceil(shards / live)`, so the live replicas together can hold every shard.
pub fn fair_share(shards: u32, live: usize) -> usize {
    let live = live.max(1);
    let shards = usize::try_from(shards).unwrap_or(usize::MAX);
    shards.div_ceil(live)
}

/// What one replica does with its shards in one round of the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    /// The most shards this replica may hold now.
    pub limit: usize,
    /// Held shards to give back (beyond the limit), highest indexes first.
    pub give_back: Vec<u32>,
    /// How many more shards this replica may take (free ones only: a held Lease is never taken
    /// before it expired).
    pub may_take: usize,
}

/// The balancing rule: with `live` replicas, a replica holding `held` keeps at most its
/// [`fair_share`], gives back the highest-indexed excess, and may take free shards up to it.
pub fn balance(shards: u32, live: usize, held: &std::collections::BTreeSet<u32>) -> Balance {
    let limit = fair_share(shards, live);
    let give_back: Vec<u32> = held.iter().rev().take(held.len().saturating_sub(limit)).copied().collect();
    Balance { limit, give_back, may_take: limit.saturating_sub(held.len()) }
}

/// How many free shards a replica may take this round: none before a retry period has passed
/// since its membership Lease was first written (`since_joined`; `None`: not yet written), then
/// up to its fair share (`balance.may_take`). Replicas started together write their membership
/// Leases within about a retry period of each other; one that counted the others before they
/// wrote theirs would take every shard, connect to every workload cluster, and give the excess
/// back a round later (a start-up memory peak and churn). Measured from the write, not in
/// rounds: a round may come early (when another replica's Lease expires).
pub fn may_take(
    balance: &Balance,
    since_joined: Option<std::time::Duration>,
    retry_period: std::time::Duration,
) -> usize {
    match since_joined {
        Some(d) if d >= retry_period => balance.may_take,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference (Fowler, Noll, Vo): FNV-1a 64 of "", "a", "foobar".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shard_of_is_pinned() {
        // Pinned values: a change of the hash would move every check to another replica.
        let table = [("default/prod", 6, 2), ("nhc-a", 6, 2), ("a", 6, 4), ("foobar", 6, 0), ("a", 1, 0), ("a", 0, 0)];
        for (key, n, want) in table {
            assert_eq!(shard_of(key, n), want, "{key} among {n}");
        }
        assert_eq!(shard_of("a", 1024), u32::try_from(0xaf63_dc4c_8601_ec8cu64 % 1024).expect("below 1024"));
        assert_eq!(machine_check_key("ns", "prod"), "ns/prod");
    }

    #[test]
    fn fair_share_table() {
        for (shards, live, want) in [(6, 3, 2), (6, 4, 2), (6, 2, 3), (6, 1, 6), (12, 5, 3), (1, 3, 1), (6, 0, 6)] {
            assert_eq!(fair_share(shards, live), want, "{shards} shards, {live} live");
        }
    }

    #[test]
    fn balance_table() {
        let held = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
        // Alone with 6: may take all.
        assert_eq!(balance(6, 1, &held(&[])), Balance { limit: 6, give_back: vec![], may_take: 6 });
        // Held all 6, two replicas joined: gives back the 4 highest.
        assert_eq!(
            balance(6, 3, &held(&[0, 1, 2, 3, 4, 5])),
            Balance { limit: 2, give_back: vec![5, 4, 3, 2], may_take: 0 }
        );
        // One of three died: may take one more.
        assert_eq!(balance(6, 2, &held(&[1, 4])), Balance { limit: 3, give_back: vec![], may_take: 1 });
    }

    #[test]
    fn a_replica_takes_nothing_until_a_retry_period_after_its_membership_was_written() {
        use std::time::Duration;
        let retry = Duration::from_secs(2);
        let alone = balance(12, 1, &BTreeSet::new());
        let of_three = balance(12, 3, &BTreeSet::new());
        let ms = |m: u64| Some(Duration::from_millis(m));
        // (balance, since its membership Lease was first written, may take)
        let table = [
            (&alone, None, 0),
            (&alone, ms(0), 0),
            (&alone, ms(1999), 0),
            (&alone, ms(2000), 12),
            (&of_three, ms(2000), 4),
            (&of_three, ms(60_000), 4),
        ];
        for (b, since, want) in table {
            assert_eq!(may_take(b, since, retry), want, "{b:?} after {since:?}");
        }
    }
}
