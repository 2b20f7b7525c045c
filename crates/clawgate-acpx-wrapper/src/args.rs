//! The wrapper's command line. Parsing is pure so it is tested without processes.
//!
//! ```text
//! clawgate-acpx-wrapper --clawgate-acpx-lease-id ID --clawgate-gateway-instance-id ID
//!                       [--clawgate-grace-ms MS] -- ADAPTER [ARGS...]
//! ```
//! The two ids are carried, not interpreted: they are the live evidence the lifecycle controller
//! reads back from `/proc/PID/cmdline` before it signals anything.

use std::ffi::OsString;
use std::time::Duration;

/// Grace between TERM and KILL of the adapter group when nobody passes `--clawgate-grace-ms`.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_millis(2_000);

pub(crate) const LEASE_FLAG: &str = "--clawgate-acpx-lease-id";
pub(crate) const INSTANCE_FLAG: &str = "--clawgate-gateway-instance-id";
pub(crate) const GRACE_FLAG: &str = "--clawgate-grace-ms";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Args {
    pub(crate) lease_id: String,
    pub(crate) gateway_instance_id: String,
    pub(crate) grace: Duration,
    pub(crate) adapter: Vec<OsString>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ArgsError {
    Missing(&'static str),
    NoValue(&'static str),
    BadGrace(String),
    Unknown(String),
    NoAdapter,
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::Missing(flag) => write!(f, "{flag} is required"),
            ArgsError::NoValue(flag) => write!(f, "{flag} needs a value"),
            ArgsError::BadGrace(value) => {
                write!(f, "{GRACE_FLAG} takes milliseconds, got {value:?}")
            }
            ArgsError::Unknown(arg) => {
                write!(
                    f,
                    "unknown argument {arg:?} (the adapter command goes after `--`)"
                )
            }
            ArgsError::NoAdapter => write!(f, "no adapter command after `--`"),
        }
    }
}

pub(crate) const USAGE: &str = "usage: clawgate-acpx-wrapper --clawgate-acpx-lease-id ID \
    --clawgate-gateway-instance-id ID [--clawgate-grace-ms MS] -- ADAPTER [ARGS...]";

pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Args, ArgsError> {
    let mut lease_id = None;
    let mut instance = None;
    let mut grace = DEFAULT_GRACE;
    let mut iter = args.into_iter();
    loop {
        let Some(arg) = iter.next() else {
            return Err(ArgsError::NoAdapter);
        };
        let text = arg.to_string_lossy().into_owned();
        let mut value = |flag: &'static str| {
            iter.next()
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty())
                .ok_or(ArgsError::NoValue(flag))
        };
        match text.as_str() {
            "--" => break,
            LEASE_FLAG => lease_id = Some(value(LEASE_FLAG)?),
            INSTANCE_FLAG => instance = Some(value(INSTANCE_FLAG)?),
            GRACE_FLAG => {
                let raw = value(GRACE_FLAG)?;
                let ms: u64 = raw.parse().map_err(|_| ArgsError::BadGrace(raw.clone()))?;
                grace = Duration::from_millis(ms);
            }
            _ => return Err(ArgsError::Unknown(text)),
        }
    }
    let adapter: Vec<OsString> = iter.collect();
    if adapter.is_empty() {
        return Err(ArgsError::NoAdapter);
    }
    Ok(Args {
        lease_id: lease_id.ok_or(ArgsError::Missing(LEASE_FLAG))?,
        gateway_instance_id: instance.ok_or(ArgsError::Missing(INSTANCE_FLAG))?,
        grace,
        adapter,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_the_contract_and_rejects_the_rest() {
        type Parsed = Result<(&'static str, &'static str, u64, usize), ArgsError>;
        let cases: &[(&str, &[&str], Parsed)] = &[
            (
                "full",
                &[
                    LEASE_FLAG,
                    "l1",
                    INSTANCE_FLAG,
                    "g1",
                    "--",
                    "agent",
                    "--acp",
                ],
                Ok(("l1", "g1", 2_000, 2)),
            ),
            (
                "grace",
                &[
                    GRACE_FLAG,
                    "50",
                    LEASE_FLAG,
                    "l",
                    INSTANCE_FLAG,
                    "g",
                    "--",
                    "a",
                ],
                Ok(("l", "g", 50, 1)),
            ),
            (
                "adapter flags are not ours",
                &[
                    LEASE_FLAG,
                    "l",
                    INSTANCE_FLAG,
                    "g",
                    "--",
                    "a",
                    LEASE_FLAG,
                    "x",
                ],
                Ok(("l", "g", 2_000, 3)),
            ),
            (
                "no lease",
                &[INSTANCE_FLAG, "g", "--", "a"],
                Err(ArgsError::Missing(LEASE_FLAG)),
            ),
            (
                "no instance",
                &[LEASE_FLAG, "l", "--", "a"],
                Err(ArgsError::Missing(INSTANCE_FLAG)),
            ),
            (
                "no adapter",
                &[LEASE_FLAG, "l", INSTANCE_FLAG, "g", "--"],
                Err(ArgsError::NoAdapter),
            ),
            (
                "no separator",
                &[LEASE_FLAG, "l", INSTANCE_FLAG, "g"],
                Err(ArgsError::NoAdapter),
            ),
            (
                "empty value",
                &[LEASE_FLAG, "", "--", "a"],
                Err(ArgsError::NoValue(LEASE_FLAG)),
            ),
            (
                "bad grace",
                &[GRACE_FLAG, "soon", "--", "a"],
                Err(ArgsError::BadGrace("soon".into())),
            ),
            ("stray", &["agent"], Err(ArgsError::Unknown("agent".into()))),
        ];
        for (name, argv, expected) in cases {
            let got = parse(os(argv)).map(|a| {
                (
                    a.lease_id,
                    a.gateway_instance_id,
                    a.grace.as_millis() as u64,
                    a.adapter.len(),
                )
            });
            let expected = expected
                .clone()
                .map(|(l, g, ms, n)| (l.to_owned(), g.to_owned(), ms, n));
            assert_eq!(got, expected, "case {name}");
        }
    }
}
