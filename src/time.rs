//! Time as people and logs read it: RFC 3339 UTC timestamps (the JSON event stream, notices,
//! `/v1/hooks`, approvals) and short durations in messages ("30s", "1s 500ms", "250ms"). A leaf
//! module on `humantime`: every kind and the dispatcher format through here, none through another.

use std::time::{Duration, SystemTime};

/// `2026-11-29T18:39:20.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Now, formatted.
pub fn now() -> String {
    rfc3339(SystemTime::now())
}

/// A timeout or backoff for a message: "30s", "1s 500ms", "250ms"; shown to the millisecond
/// (the precision timeouts are configured in), "0s" for zero.
pub fn fmt_duration(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn formats_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_977_560_123);
        assert_eq!(rfc3339(t), "2026-11-29T18:39:20.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(fmt_duration(Duration::from_secs(30)), "30s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1s 500ms");
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_micros(250_700)), "250ms");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
    }
}
