//! Go duration strings (`metav1.Duration`, e.g. `300s`, `1h30m`, `-1s`), the format upstream
//! manifests use; parsed exactly so that upstream manifests keep their meaning.

use jiff::SignedDuration;

/// Why a duration string was refused; the caller adds the field path and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("is empty; expected a duration such as 300s, 10m or 1h30m")]
    Empty,
    /// Not of the `<number><unit>…` shape.
    #[error("is not a duration; expected a number with a unit (ns, us, ms, s, m, h), e.g. 300s, 10m or 1h30m")]
    Malformed,
    /// A number without a unit, such as `300`.
    #[error("has a number without a unit; write e.g. 300s")]
    MissingUnit,
    /// Beyond what a duration can hold.
    #[error("is too large")]
    Overflow,
}

/// Parses a Go duration string (`time.ParseDuration` grammar).
pub fn parse_go_duration(text: &str) -> Result<SignedDuration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let (negative, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(SignedDuration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Malformed);
    }
    let mut total: i128 = 0; // nanoseconds
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number = &rest[..num_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(DurationError::Malformed);
        }
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(DurationError::MissingUnit),
            _ => return Err(DurationError::Malformed),
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let int_value: i128 =
            if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| DurationError::Overflow)? };
        let mut nanos = int_value.checked_mul(scale).ok_or(DurationError::Overflow)?;
        let mut frac_scale = scale;
        for digit in frac_part.bytes() {
            frac_scale /= 10;
            if frac_scale == 0 {
                break;
            }
            nanos += i128::from(digit - b'0') * frac_scale;
        }
        total = total.checked_add(nanos).ok_or(DurationError::Overflow)?;
        if total > i128::from(i64::MAX) {
            return Err(DurationError::Overflow);
        }
    }
    let total = if negative { -total } else { total };
    let nanos = i64::try_from(total).map_err(|_| DurationError::Overflow)?;
    Ok(SignedDuration::from_nanos(nanos))
}

/// Formats a duration the way Go prints it (`5m0s`, `1h30m0s`, `1.5s`), for messages and status.
pub fn format_go_duration(d: SignedDuration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (value, unit) = if n < 1_000 {
            (n as f64, "ns")
        } else if n < 1_000_000 {
            (n as f64 / 1e3, "µs")
        } else {
            (n as f64 / 1e6, "ms")
        };
        return format!("{sign}{value}{unit}");
    }
    let hours = n / 3_600_000_000_000;
    let minutes = (n / 60_000_000_000) % 60;
    let sec_nanos = n % 60_000_000_000;
    let secs = sec_nanos / 1_000_000_000;
    let frac = sec_nanos % 1_000_000_000;
    let mut out = String::from(sign);
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{secs}s"));
    } else {
        let frac_text = format!("{frac:09}");
        out.push_str(&format!("{secs}.{}s", frac_text.trim_end_matches('0')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("0s", 0),
            ("300s", 300_000_000_000),
            ("10m", 600_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("1.5s", 1_500_000_000),
            ("-1s", -1_000_000_000),
            ("250ms", 250_000_000),
            ("1h2m3s4ms", 3_723_004_000_000),
            ("2µs", 2_000),
            (".5m", 30_000_000_000),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse_go_duration(text), Ok(SignedDuration::from_nanos(*nanos)), "{text}");
        }
    }

    #[test]
    fn refuses_malformed_durations() {
        let cases: &[(&str, DurationError)] = &[
            ("", DurationError::Empty),
            ("300", DurationError::MissingUnit),
            ("5 minutes", DurationError::Malformed),
            ("1d", DurationError::Malformed),
            ("s", DurationError::Malformed),
            ("1..2s", DurationError::Malformed),
            ("-", DurationError::Malformed),
            ("9999999999h", DurationError::Overflow),
        ];
        for (text, err) in cases {
            assert_eq!(parse_go_duration(text), Err(err.clone()), "{text:?}");
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (300_000_000_000, "5m0s"),
            (5_400_000_000_000, "1h30m0s"),
            (1_500_000_000, "1.5s"),
            (-1_000_000_000, "-1s"),
            (250_000_000, "250ms"),
        ];
        for (nanos, text) in cases {
            assert_eq!(format_go_duration(SignedDuration::from_nanos(*nanos)), *text);
        }
    }

    proptest::proptest! {
        #[test]
        fn format_then_parse_round_trips(nanos in -10_000_000_000_000i64..10_000_000_000_000i64) {
            let d = SignedDuration::from_nanos(nanos);
            let text = format_go_duration(d);
            let back = parse_go_duration(&text).expect("formatted text parses");
            // sub-second formats may round through f64; whole-second durations are exact
            if nanos.unsigned_abs() >= 1_000_000_000 {
                proptest::prop_assert_eq!(back, d);
            }
        }
    }
}
