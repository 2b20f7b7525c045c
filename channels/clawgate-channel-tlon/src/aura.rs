//! Urbit's atom spellings this channel needs: `@da` (absolute date) from and to Unix
//! milliseconds, and `@ud` (unsigned decimal, dots every three digits).
//!
//! `@da` is a 128-bit count of 2⁻⁶⁴ s since Urbit's epoch; 1970-01-01 is
//! `0x8000000cce9e0d80 << 64`. A millisecond is `2⁶⁴ / 1000` of it, rounded down (what
//! `@urbit/aura`'s `da.fromUnix` does). Writ ids are `~author/<@ud of the @da sent-time>`.

/// `~1970.1.1` as an `@da`.
pub const DA_UNIX_EPOCH: u128 = 0x8000_000c_ce9e_0d80_u128 << 64;
const DA_SECOND: u128 = 1 << 64;

/// The `@da` of Unix time `ms` (milliseconds).
pub fn da_from_unix_ms(ms: u64) -> u128 {
    DA_UNIX_EPOCH + u128::from(ms) * DA_SECOND / 1000
}

/// The Unix milliseconds of an `@da`, rounded to the nearest millisecond; `None` before 1970
/// or past what milliseconds in a `u64` hold.
pub fn unix_ms_from_da(da: u128) -> Option<u64> {
    let since = da.checked_sub(DA_UNIX_EPOCH)?;
    let ms = since.checked_mul(1000)?.checked_add(DA_SECOND / 2)? >> 64;
    u64::try_from(ms).ok()
}

/// `@ud`: decimal with a dot every three digits from the right (`1.234.567`).
pub fn format_ud(value: u128) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('.');
        }
        out.push(c);
    }
    out
}

/// Parses an `@ud` (dots every three digits; a bare number of up to three digits).
pub fn parse_ud(text: &str) -> Option<u128> {
    let mut groups = text.split('.');
    let first = groups.next()?;
    if first.is_empty() || first.len() > 3 || (first.len() > 1 && first.starts_with('0')) {
        return None;
    }
    let mut digits = first.to_owned();
    for group in groups {
        if group.len() != 3 {
            return None;
        }
        digits.push_str(group);
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A ship name as Tlon writes it: with its leading `~`.
pub fn ship(name: &str) -> String {
    let name = name.trim();
    if name.starts_with('~') {
        name.to_owned()
    } else {
        format!("~{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values `@urbit/aura` 3.0.0 gives (`da.fromUnix`, `render('ud', …)`).
    #[test]
    fn da_and_ud_match_urbit_aura() {
        let cases: &[(u64, &str)] = &[
            (0, "170.141.184.475.152.167.957.503.069.145.530.368.000"),
            (1_000, "170.141.184.475.152.167.975.949.813.219.239.919.616"),
            (
                1_700_000_000_000,
                "170.141.184.506.511.632.882.809.306.892.730.368.000",
            ),
            (
                1_700_000_000_123,
                "170.141.184.506.511.632.885.078.256.413.796.642.848",
            ),
            (
                1_764_633_600_999,
                "170.141.184.507.703.912.379.000.117.897.694.107.664",
            ),
        ];
        for (ms, ud) in cases {
            let da = da_from_unix_ms(*ms);
            assert_eq!(format_ud(da), *ud, "{ms}");
            assert_eq!(parse_ud(ud), Some(da), "{ud}");
            assert_eq!(unix_ms_from_da(da), Some(*ms), "{ms} round trip");
        }
        assert_eq!(
            DA_UNIX_EPOCH,
            170_141_184_475_152_167_957_503_069_145_530_368_000
        );
    }

    #[test]
    fn ud_groups_digits_by_three() {
        for (value, text) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1.000"),
            (1_234_567, "1.234.567"),
            (12_345, "12.345"),
        ] {
            assert_eq!(format_ud(value), text);
            assert_eq!(parse_ud(text), Some(value));
        }
        for bad in ["", "1.23", "1234", "01.000", "1.2a4", ".123", "1..000"] {
            assert_eq!(parse_ud(bad), None, "{bad:?}");
        }
        assert_eq!(unix_ms_from_da(0), None, "before 1970");
    }

    #[test]
    fn ships_carry_their_sig() {
        assert_eq!(ship("zod"), "~zod");
        assert_eq!(ship("~nec"), "~nec");
    }
}
