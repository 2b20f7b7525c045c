//! The simulator on its own, over HTTP: the `spaces.messages` rules (requestId, client-assigned
//! ids, reply options, update masks, error envelopes, auth), the OAuth token endpoint, and the
//! cross-check with Google's own Python client and google-auth (its token verification, and its
//! service account credentials against the token endpoint).
#![allow(clippy::unwrap_used)]

mod google_python;
mod oauth;
mod rest;
