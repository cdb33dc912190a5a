//! Short-circuit thresholds: an absolute count or a percentage of the targets (`maxUnhealthy`,
//! `minHealthy`), and Cluster API's inclusive `unhealthyRange` (`[min-max]`).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::fmt;

/// A threshold given as a count or as a percentage of the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    /// An absolute number of targets.
    Count(u32),
    /// A percentage (0–100) of the targets.
    Percent(u32),
}

/// How a percentage is turned into a count: upstream rounds `maxUnhealthy` down and
/// `minHealthy` up, so both err on the side of not remediating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Round towards zero.
    Down,
    /// Round away from zero.
    Up,
}

/// Why a threshold was refused; the caller adds the field path and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    /// A negative count.
    #[error("must not be negative")]
    Negative,
    /// A percentage above 100.
    #[error("must be a percentage between 0% and 100%")]
    PercentOutOfRange,
    /// Neither a whole number nor `N%`.
    #[error("must be a whole number or a percentage such as 40%")]
    Malformed,
}

impl IntOrPercent {
    /// Parses the wire form (`3`, `"3"`, `"40%"`).
    pub fn parse(value: &IntOrString) -> Result<Self, ThresholdError> {
        match value {
            IntOrString::Int(n) => u32::try_from(*n).map(IntOrPercent::Count).map_err(|_| ThresholdError::Negative),
            IntOrString::String(s) => Self::parse_str(s),
        }
    }

    fn parse_str(s: &str) -> Result<Self, ThresholdError> {
        let s = s.trim();
        if let Some(number) = s.strip_suffix('%') {
            if number.starts_with('-') {
                return Err(ThresholdError::Negative);
            }
            let pct: u32 = digits(number).ok_or(ThresholdError::Malformed)?;
            if pct > 100 {
                return Err(ThresholdError::PercentOutOfRange);
            }
            Ok(IntOrPercent::Percent(pct))
        } else {
            if s.starts_with('-') && digits(&s[1..]).is_some() {
                return Err(ThresholdError::Negative);
            }
            digits(s).map(IntOrPercent::Count).ok_or(ThresholdError::Malformed)
        }
    }

    /// The count this threshold stands for among `total` targets; never fails for a valid input.
    pub fn scaled(self, total: usize, rounding: Rounding) -> u64 {
        match self {
            IntOrPercent::Count(n) => u64::from(n),
            IntOrPercent::Percent(p) => {
                let product = total as u64 * u64::from(p);
                match rounding {
                    Rounding::Down => product / 100,
                    Rounding::Up => product.div_ceil(100),
                }
            }
        }
    }
}

impl fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrPercent::Count(n) => write!(f, "{n}"),
            IntOrPercent::Percent(p) => write!(f, "{p}%"),
        }
    }
}

fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Cluster API's `unhealthyRange`: remediation is allowed while the unhealthy count is within
/// `[min, max]`, both inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnhealthyRange {
    /// Lowest unhealthy count at which remediation is allowed.
    pub min: u32,
    /// Highest unhealthy count at which remediation is allowed.
    pub max: u32,
}

/// Why a range was refused; the caller adds the field path and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Not of the `[min-max]` shape.
    #[error("must have the form [min-max] with whole numbers, e.g. [1-3]")]
    Malformed,
    /// `min` greater than `max`.
    #[error("is inverted: the minimum {min} is greater than the maximum {max}")]
    Inverted {
        /// The minimum given.
        min: u32,
        /// The maximum given.
        max: u32,
    },
}

impl UnhealthyRange {
    /// Parses `[min-max]`.
    pub fn parse(s: &str) -> Result<Self, RangeError> {
        let inner = s.trim().strip_prefix('[').and_then(|r| r.strip_suffix(']')).ok_or(RangeError::Malformed)?;
        let (min, max) = inner.split_once('-').ok_or(RangeError::Malformed)?;
        let min = digits(min.trim()).ok_or(RangeError::Malformed)?;
        let max = digits(max.trim()).ok_or(RangeError::Malformed)?;
        if min > max {
            return Err(RangeError::Inverted { min, max });
        }
        Ok(UnhealthyRange { min, max })
    }

    /// Whether `unhealthy` lies within the range.
    pub fn contains(self, unhealthy: u64) -> bool {
        u64::from(self.min) <= unhealthy && unhealthy <= u64::from(self.max)
    }
}

impl fmt::Display for UnhealthyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}-{}]", self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_thresholds() {
        let ok: &[(IntOrString, IntOrPercent)] = &[
            (IntOrString::Int(3), IntOrPercent::Count(3)),
            (IntOrString::Int(0), IntOrPercent::Count(0)),
            (IntOrString::String("3".into()), IntOrPercent::Count(3)),
            (IntOrString::String("40%".into()), IntOrPercent::Percent(40)),
            (IntOrString::String("100%".into()), IntOrPercent::Percent(100)),
            (IntOrString::String("0%".into()), IntOrPercent::Percent(0)),
        ];
        for (wire, want) in ok {
            assert_eq!(IntOrPercent::parse(wire), Ok(*want), "{wire:?}");
        }
        let bad: &[(IntOrString, ThresholdError)] = &[
            (IntOrString::Int(-1), ThresholdError::Negative),
            (IntOrString::String("-1".into()), ThresholdError::Negative),
            (IntOrString::String("-5%".into()), ThresholdError::Negative),
            (IntOrString::String("101%".into()), ThresholdError::PercentOutOfRange),
            (IntOrString::String("forty%".into()), ThresholdError::Malformed),
            (IntOrString::String("40 %".into()), ThresholdError::Malformed),
            (IntOrString::String("".into()), ThresholdError::Malformed),
            (IntOrString::String("1.5".into()), ThresholdError::Malformed),
        ];
        for (wire, want) in bad {
            assert_eq!(IntOrPercent::parse(wire), Err(want.clone()), "{wire:?}");
        }
    }

    #[test]
    fn percentages_round_as_upstream() {
        // 40% of 7 = 2.8: maxUnhealthy rounds down to 2, minHealthy rounds up to 3.
        assert_eq!(IntOrPercent::Percent(40).scaled(7, Rounding::Down), 2);
        assert_eq!(IntOrPercent::Percent(40).scaled(7, Rounding::Up), 3);
        assert_eq!(IntOrPercent::Percent(100).scaled(0, Rounding::Down), 0);
        assert_eq!(IntOrPercent::Count(5).scaled(2, Rounding::Down), 5);
    }

    #[test]
    fn parses_ranges() {
        assert_eq!(UnhealthyRange::parse("[1-3]"), Ok(UnhealthyRange { min: 1, max: 3 }));
        assert_eq!(UnhealthyRange::parse("[0-0]"), Ok(UnhealthyRange { min: 0, max: 0 }));
        assert_eq!(UnhealthyRange::parse("[3-1]"), Err(RangeError::Inverted { min: 3, max: 1 }));
        for bad in ["1-3", "[1-]", "[-3]", "[a-b]", "[1,3]", "[-1-3]", ""] {
            assert_eq!(UnhealthyRange::parse(bad), Err(RangeError::Malformed), "{bad}");
        }
        let r = UnhealthyRange { min: 1, max: 3 };
        assert!(!r.contains(0) && r.contains(1) && r.contains(3) && !r.contains(4));
    }
}
