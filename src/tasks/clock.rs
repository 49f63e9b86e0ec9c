//! ISO 8601 timestamps for task records (`createdAt`, `lastUpdatedAt`), without a
//! date library: the civil-from-days conversion is a dozen lines.

/// Format milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
///
/// Every `tasks/get` renders two of these, so the digits are written into a fixed
/// buffer: through `format!` they were 6 % of a poll's instructions
/// (benches/RESULTS.md, "Shared identity, direct timestamps").
pub fn iso8601(ms: u64) -> String {
    let (year, month, d, h, m, s, millis) = civil(ms);
    let Ok(year4) = u64::try_from(year) else {
        return reference(ms);
    };
    if year4 > 9999 {
        return reference(ms);
    }
    let mut b = *b"0000-00-00T00:00:00.000Z";
    put_digits(&mut b[0..4], year4);
    put_digits(&mut b[5..7], month);
    put_digits(&mut b[8..10], d);
    put_digits(&mut b[11..13], h);
    put_digits(&mut b[14..16], m);
    put_digits(&mut b[17..19], s);
    put_digits(&mut b[20..23], millis);
    // Only ASCII digits and separators were written.
    b.iter().map(|&c| char::from(c)).collect()
}

/// Writes `v` right-aligned into `dst` as decimal digits, zero-padded.
fn put_digits(dst: &mut [u8], mut v: u64) {
    for slot in dst.iter_mut().rev() {
        // `v % 10` is below 10.
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// The same text through `format!`: years past 9999 take more than four digits.
fn reference(ms: u64) -> String {
    let (year, month, d, h, m, s, millis) = civil(ms);
    format!("{year:04}-{month:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

/// Year, month, day, hour, minute, second and millisecond (UTC) of `ms`.
fn civil(ms: u64) -> (i64, u64, u64, u64, u64, u64, u64) {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    // Month 1..=12 and day 1..=31 by construction.
    (
        year,
        month.unsigned_abs(),
        d.unsigned_abs(),
        h,
        m,
        s,
        millis,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(1_796_043_723_456), "2026-11-30T13:02:03.456Z");
        assert_eq!(iso8601(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        // Past year 9999 the year takes five digits, as `format!` writes it.
        assert_eq!(iso8601(253_402_300_800_000), "10000-01-01T00:00:00.000Z");
    }

    #[test]
    fn matches_format_across_instants() {
        // An odd step of about 92 days walks every field through many values.
        let mut ms = 0u64;
        while ms < 4_102_444_800_000 {
            assert_eq!(iso8601(ms), reference(ms), "{ms}");
            ms += 7_919_993_003;
        }
        for ms in [u64::MAX, u64::MAX / 1000, 86_399_999, 86_400_000] {
            assert_eq!(iso8601(ms), reference(ms), "{ms}");
        }
    }
}
