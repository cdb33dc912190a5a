//! CPU time and memory of the measured process, read from /proc.

use anyhow::{Context as _, Result, bail};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often resident memory is sampled (the kernel's high-water mark covers the gaps for
/// the whole-run peak).
const SAMPLE: Duration = Duration::from_millis(100);

/// User + system CPU seconds the process has used so far (all threads).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ")": state is field 3 of stat(5), so utime (14) and stime (15) are at 11 and 12.
    let (Some(utime), Some(stime)) = (fields.get(11), fields.get(12)) else { bail!("short /proc/{pid}/stat") };
    let ticks: u64 = utime.parse::<u64>()? + stime.parse::<u64>()?;
    Ok(ticks as f64 / f64::from(rustix::param::clock_ticks_per_second() as u32))
}

/// A `/proc/<pid>/status` memory field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line.trim().trim_end_matches("kB").trim().parse()?)
}

/// Resets `pid`'s resident-memory high-water mark (`VmHWM`) to its current resident memory
/// (`/proc/<pid>/clear_refs` value 5, Linux 4.0+), so a later `VmHWM` is the peak of a phase.
pub fn reset_peak(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").with_context(|| format!("/proc/{pid}/clear_refs"))
}

/// Resident memory samples over time, to tell a phase's peak.
#[derive(Clone, Default)]
pub struct RssSamples(Arc<Mutex<Vec<(Instant, u64)>>>);

impl RssSamples {
    /// Samples `pid`'s resident memory until the process is gone or the task is aborted.
    pub fn spawn(&self, pid: u32) -> tokio::task::JoinHandle<()> {
        let samples = self.0.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE);
            loop {
                tick.tick().await;
                let Ok(kib) = status_kib(pid, "VmRSS") else { return };
                samples.lock().unwrap_or_else(PoisonError::into_inner).push((Instant::now(), kib));
            }
        })
    }

    /// The highest sample taken in `from..to`, in MiB.
    pub fn peak_mib(&self, from: Instant, to: Instant) -> f64 {
        let samples = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let kib = samples.iter().filter(|(at, _)| (from..to).contains(at)).map(|(_, k)| *k).max().unwrap_or(0);
        kib as f64 / 1024.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let burn: u64 = (0..20_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(burn > 0);
        assert!(cpu_seconds(me).expect("cpu") > 0.0);
        let rss = status_kib(me, "VmRSS").expect("rss");
        assert!(rss > 100 && rss <= status_kib(me, "VmHWM").expect("hwm"));
        assert!(status_kib(me, "NoSuchField").is_err());
    }

    #[test]
    fn the_peak_is_reset_to_the_current_resident_memory() {
        let me = std::process::id();
        // 64 MiB touched, then freed: the high-water mark stays above the resident memory.
        let big = vec![1u8; 64 << 20];
        assert!(big.iter().map(|b| u64::from(*b)).sum::<u64>() > 0);
        drop(big);
        let before = status_kib(me, "VmHWM").expect("hwm");
        reset_peak(me).expect("clear_refs");
        let after = status_kib(me, "VmHWM").expect("hwm");
        assert!(after + 32 * 1024 < before, "high-water mark {before} KiB not reset (now {after} KiB)");
    }
}
