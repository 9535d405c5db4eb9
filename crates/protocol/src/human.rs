//! How numbers read for people in every command's output (`hanzod job status`, `job
//! watch`, `publications`, the demo's summary): durations, GYM amounts and wall-clock times.
//! JSON output keeps the raw units (ms, GYM wei, ms since the Unix epoch); these are for text.

use hanzod_actors::types::GymWei;

/// A duration in ms for people: `850 ms`, `2.4 s`, `3 min 20 s`, `2 h 5 min`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        // Tenths of a second, rounded; 59.95 s and above read in minutes.
        1_000..=59_949 => {
            let tenths = (ms + 50) / 100;
            format!("{}.{} s", tenths / 10, tenths % 10)
        }
        59_950..=3_599_499 => {
            let s = (ms + 500) / 1000;
            format!("{} min {} s", s / 60, s % 60)
        }
        _ => {
            let m = ms / 60_000;
            format!("{} h {} min", m / 60, m % 60)
        }
    }
}

/// Several durations: `206 ms`, `206 ms and 180 ms`, `206 ms, 180 ms and 1.2 s`.
pub fn durations(ms: &[u64]) -> String {
    let parts: Vec<String> = ms.iter().map(|&m| duration(m)).collect();
    match parts.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// An amount of GYM wei in whole GYM rounded to at most 4 decimals: 1.5 × 10^18 wei →
/// `1.5 GYM`.
pub fn gym(wei: GymWei) -> String {
    let per = GymWei::PER_GYM;
    let whole = wei.0 / per;
    // Rounded half up to 4 decimals (10^14 wei), carried into the whole part at .99995.
    let frac = ((wei.0 % per) + per / 20_000) / (per / 10_000);
    let (whole, frac) = if frac >= 10_000 {
        (whole + 1, 0)
    } else {
        (whole, frac)
    };
    let frac = format!("{frac:04}");
    match frac.trim_end_matches('0') {
        "" if whole == 0 && wei.0 > 0 => "< 0.0001 GYM".into(),
        "" => format!("{whole} GYM"),
        f => format!("{whole}.{f} GYM"),
    }
}

/// A GYM wei amount given as a decimal string (as on the wire) in whole GYM; a string that
/// is not a number is shown as it is, with its unit.
pub fn gym_str(wei: &str) -> String {
    wei.parse::<u128>()
        .map_or_else(|_| format!("{wei} wei"), |w| gym(GymWei(w)))
}

/// A wall-clock time in ms since the Unix epoch as UTC, to the second:
/// `2026-12-02 01:06:52 UTC`; `-` for 0 (unset on the wire).
pub fn utc(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    hanzod_actors::types::Timestamp(ms).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_expect() {
        assert_eq!(duration(206), "206 ms");
        assert_eq!(duration(2_400), "2.4 s");
        assert_eq!(duration(59_949), "59.9 s");
        assert_eq!(duration(59_950), "1 min 0 s");
        assert_eq!(duration(60_000), "1 min 0 s");
        assert_eq!(duration(200_000), "3 min 20 s");
        assert_eq!(duration(7_500_000), "2 h 5 min");
        assert_eq!(durations(&[]), "");
        assert_eq!(durations(&[206]), "206 ms");
        assert_eq!(durations(&[206, 180]), "206 ms and 180 ms");
        assert_eq!(durations(&[206, 180, 1_200]), "206 ms, 180 ms and 1.2 s");
    }

    #[test]
    fn gym_amounts_read_in_whole_gym_with_at_most_four_decimals() {
        assert_eq!(gym(GymWei(0)), "0 GYM");
        assert_eq!(gym(GymWei::gym(100)), "100 GYM");
        assert_eq!(gym_str("1500000000000000000"), "1.5 GYM");
        assert_eq!(gym_str("33333333333333333333"), "33.3333 GYM");
        assert_eq!(gym_str("999999999999999999"), "1 GYM");
        assert_eq!(gym_str("12"), "< 0.0001 GYM");
        assert_eq!(gym_str("0"), "0 GYM");
        assert_eq!(gym_str("lots"), "lots wei");
    }

    #[test]
    fn times_read_as_utc_to_the_second() {
        assert_eq!(utc(1_764_637_612_345), "2025-12-02 01:06:52 UTC");
        assert_eq!(utc(0), "-");
        assert_eq!(
            utc(u64::MAX),
            "18446744073709551615 ms since the Unix epoch"
        );
    }
}
