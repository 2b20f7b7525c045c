//! Opaque identifiers. Generation lives with the I/O layers (one UUID v7 generator there);
//! this crate only validates, so an id read from disk or argv is known to be well formed.

use std::fmt;

/// An identifier was empty, too long, or contained characters that cannot travel safely
/// through argv, file names and log lines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: {reason}")]
pub struct ParseIdError {
    /// What kind of id it was meant to be (`intent id`, `lease id`…).
    pub kind: &'static str,
    /// The rejected text.
    pub value: String,
    /// What rule it broke.
    pub reason: &'static str,
}

const MAX_ID_LEN: usize = 128;

fn validate(kind: &'static str, value: &str) -> Result<(), ParseIdError> {
    let fail = |reason| {
        Err(ParseIdError {
            kind,
            value: value.to_owned(),
            reason,
        })
    };
    if value.is_empty() {
        return fail("must not be empty");
    }
    if value.len() > MAX_ID_LEN {
        return fail("must be at most 128 bytes");
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return fail("may contain only ASCII letters, digits, '-', '_', '.' and ':'");
    }
    Ok(())
}

macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps an identifier.
            pub fn parse(value: impl Into<String>) -> Result<Self, ParseIdError> {
                let value = value.into();
                validate($kind, &value)?;
                Ok(Self(value))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

opaque_id!(
    /// Identifies one durable send intent (UUID v7 text in practice: sorts by creation time).
    IntentId,
    "intent id"
);
opaque_id!(
    /// Identifies one ACPX process lease; passed to the wrapper as `--clawgate-acpx-lease-id`.
    LeaseId,
    "lease id"
);
opaque_id!(
    /// Stable per state directory; tells this gateway's processes apart from another gateway's.
    /// Not a secret, a distinguishing mark (`--clawgate-gateway-instance-id`).
    GatewayInstanceId,
    "gateway instance id"
);
