//! Flapping targets on Vigil's own clock (`spec.flapping`). A condition's `lastTransitionTime`
//! starts again with each flap, so a Node that is NotReady for four minutes every quarter hour
//! never breaks a five-minute rule. Vigil keeps its own record instead: an episode of a target
//! starts at the decision's `now` when a decision first sees any rule match it (however briefly)
//! and ends at the `now` when one first sees none match. The record lives in the check's
//! `status.flapping`, so a restart or another replica counts the same flaps; it is derived from
//! the previous status, what is observed and `now` alone (no clock is read).
//!
//! Bounded: per target only the episodes that ended within the window and the open one, at most
//! `episodes` of them; at most [`MAX_TRACKED`] targets, in name order (the rest are not tracked,
//! so never remediated for flapping: the safe side). Counting reads only episodes that started
//! within the window at decision time, so an old episode left in the record never counts.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use vigil_api::shared::{FlapEpisode, FlappingTarget};
use vigil_api::validate::FlappingPolicy;

/// Most targets whose episodes a status lists (name order); keeps the status object small.
pub const MAX_TRACKED: usize = 1000;

/// The new record: the previous one (`prev`, any order) advanced by one observation — the
/// names of the targets any rule matches now (`matching`, any order) — at `now`.
pub fn advance(
    prev: &[FlappingTarget],
    matching: &[&str],
    policy: FlappingPolicy,
    now: Timestamp,
) -> Vec<FlappingTarget> {
    let at = floor_second(now);
    let mut before: Vec<&FlappingTarget> = prev.iter().collect();
    before.sort_by(|a, b| a.name.cmp(&b.name));
    before.dedup_by(|a, b| a.name == b.name);
    let mut seen: Vec<&str> = matching.to_vec();
    seen.sort_unstable();
    seen.dedup();
    let mut names: Vec<&str> = before.iter().map(|t| t.name.as_str()).chain(seen.iter().copied()).collect();
    names.sort_unstable();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        if out.len() == MAX_TRACKED {
            break;
        }
        let mut episodes = match before.binary_search_by(|t| t.name.as_str().cmp(name)) {
            Ok(i) => before[i].episodes.clone(),
            Err(_) => Vec::new(),
        };
        let open = episodes.last().is_some_and(|e| e.end.is_none());
        match (seen.binary_search(&name).is_ok(), open) {
            (true, false) => episodes.push(FlapEpisode { start: Time(at), end: None }),
            (false, true) => {
                if let Some(last) = episodes.last_mut() {
                    last.end = Some(Time(at));
                }
            }
            _ => {}
        }
        let kept = prune(episodes, policy, now);
        if !kept.is_empty() {
            out.push(FlappingTarget { name: name.to_string(), episodes: kept });
        }
    }
    out
}

/// Keeps the open episode and those that ended within the window, the last `episodes` of them.
fn prune(episodes: Vec<FlapEpisode>, policy: FlappingPolicy, now: Timestamp) -> Vec<FlapEpisode> {
    let since = now.checked_sub(policy.window).unwrap_or(Timestamp::MIN);
    let mut kept: Vec<FlapEpisode> =
        episodes.into_iter().filter(|e| e.end.as_ref().is_none_or(|t| t.0 >= since)).collect();
    let extra = kept.len().saturating_sub(policy.episodes);
    kept.drain(..extra);
    kept
}

/// How many of a target's episodes started within the window at `now` (the open one included):
/// only these count, whatever the record still holds.
pub fn within(target: &FlappingTarget, window: SignedDuration, now: Timestamp) -> usize {
    let since = now.checked_sub(window).unwrap_or(Timestamp::MIN);
    target.episodes.iter().filter(|e| e.start.0 >= since && e.start.0 <= now).count()
}

/// Whether `name` is flapping at `now`: at least `policy.episodes` episodes started within the
/// window. Returns the count when it is.
pub fn flapping(record: &[FlappingTarget], name: &str, policy: FlappingPolicy, now: Timestamp) -> Option<usize> {
    let target = find(record, name)?;
    let count = within(target, policy.window, now);
    (count >= policy.episodes).then_some(count)
}

/// Target `name`'s entry: [`advance`] writes the record sorted by name; one written otherwise
/// (by hand) is searched in full.
pub fn find<'r>(record: &'r [FlappingTarget], name: &str) -> Option<&'r FlappingTarget> {
    match record.binary_search_by(|t| t.name.as_str().cmp(name)) {
        Ok(i) => record.get(i),
        Err(_) => record.iter().find(|t| t.name == name),
    }
}

/// Forgets the episodes of the targets `remediated` says are being remediated: the flaps that
/// led to a remediation are not counted again once the target recovers.
pub fn clear(record: &mut Vec<FlappingTarget>, remediated: impl Fn(&str) -> bool) {
    record.retain(|t| !remediated(&t.name));
}

/// `t` rounded down to a whole second: status times are written in whole seconds, and a start
/// written later than it happened would keep an episode in the window longer (more remediation,
/// the unsafe direction).
fn floor_second(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + minute * 60).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    const POLICY: FlappingPolicy = FlappingPolicy { episodes: 3, window: SignedDuration::from_hours(1) };

    #[test]
    fn an_episode_opens_on_a_match_and_closes_when_none_matches() {
        let r = advance(&[], &["a"], POLICY, at(0));
        assert_eq!(r.len(), 1);
        assert!(r[0].episodes[0].end.is_none());
        let r = advance(&r, &["a"], POLICY, at(2));
        assert_eq!(r[0].episodes.len(), 1);
        let r = advance(&r, &[], POLICY, at(3));
        assert_eq!(r[0].episodes[0].end, Some(Time(at(3))));
        let r = advance(&r, &["a"], POLICY, at(10));
        assert_eq!(r[0].episodes.len(), 2);
        assert_eq!(flapping(&r, "a", POLICY, at(10)), None);
        let r = advance(&r, &[], POLICY, at(13));
        let r = advance(&r, &["a"], POLICY, at(20));
        assert_eq!(flapping(&r, "a", POLICY, at(20)), Some(3));
    }

    #[test]
    fn old_episodes_leave_the_record_and_never_count() {
        let mut r = Vec::new();
        for i in 0..3 {
            r = advance(&r, &["a"], POLICY, at(i * 40));
            r = advance(&r, &[], POLICY, at(i * 40 + 3));
        }
        assert!(r[0].episodes.len() <= 2);
        assert_eq!(flapping(&r, "a", POLICY, at(83)), None);
    }
}
