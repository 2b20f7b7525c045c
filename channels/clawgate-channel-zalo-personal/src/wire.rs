//! The Zalo Web protocol's encodings, as zca-js 2.2.0 speaks them (`src/utils.ts`,
//! `src/apis/login.ts`, `src/apis/listen.ts`), shared by the client and the simulator.
//!
//! - **Request parameters and answers**: the JSON of the parameters, AES-CBC with a zero IV and
//!   PKCS#7, base64 (`encodeAES`). After login the key is the session's `zpw_enk` (base64 of the
//!   raw key); the login call itself uses a 32-character key derived from `zcid`/`zcid_ext`
//!   (below), taken as its UTF-8 bytes (AES-256).
//! - **`signkey`**: hex MD5 of `"zsecure" + <call> + <the parameter values in key order>`.
//! - **Login parameters**: `zcid` = upper-case hex of AES-CBC(`"<type>,<imei>,<first launch ms>"`)
//!   under a fixed key; `zcid_ext` a random hex string; the key = the even characters of
//!   `MD5(zcid_ext)` (upper-case hex) `[..8]` + the even characters of `zcid` `[..12]` + the odd
//!   characters of `zcid` reversed `[..12]`.
//! - **Listener frames**: a 4-byte header (version `u8`, command `u16` little-endian,
//!   sub-command `u8`) and a JSON body. Event bodies are `{"data": …, "encrypt": 0..=3}`:
//!   0 plain JSON, 1 base64 of zlib, 2 base64 (URL-encoded) of AES-GCM of zlib, 3 the same
//!   without zlib. The AES-GCM blob is IV (16 bytes) + associated data (16 bytes) + ciphertext
//!   and tag; its key is the base64 `key` of the connection's first frame (1, 1, 1).

use std::io::{Read, Write};

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use aes_gcm::aead::consts::U16;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use md5::{Digest, Md5};
use serde_json::Value;

/// zca-js's `API_TYPE` (the Web client).
pub const API_TYPE: u32 = 30;
/// zca-js's `API_VERSION` (`zpw_ver`).
pub const API_VERSION: u32 = 685;
/// The fixed key `zcid` is encrypted under.
const ZCID_KEY: &[u8; 32] = b"3FC4F0D2AB50057BCE0D90D9187A22B1";

/// The listener's commands (header `cmd`).
pub mod cmd {
    /// (1, 1, 1) the cipher key, the first frame of a connection.
    pub const CIPHER_KEY: u16 = 1;
    /// (1, 2, 1) the client's ping.
    pub const PING: u16 = 2;
    /// (1, 501, 0) direct messages.
    pub const USER_MESSAGES: u16 = 501;
    /// (1, 521, 0) group messages.
    pub const GROUP_MESSAGES: u16 = 521;
    /// (1, 3000, 0) another connection was opened: this one is closing.
    pub const DUPLICATE: u16 = 3000;
}

/// WebSocket close codes of the listener (zca-js `CloseReason`).
pub mod close {
    /// Another Zalo Web session of the account took over.
    pub const DUPLICATE_CONNECTION: u16 = 3000;
    /// The session was kicked (logged out elsewhere).
    pub const KICK_CONNECTION: u16 = 3003;
}

/// Something in a Zalo payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable Zalo payload: {0}")]
pub struct WireError(pub String);

fn err(what: impl Into<String>) -> WireError {
    WireError(what.into())
}

/// Hex MD5.
pub fn md5_hex(data: &[u8]) -> String {
    hex(&Md5::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The `signkey` of `call` over `params` (name, value).
pub fn sign_key(call: &str, params: &[(&str, String)]) -> String {
    let mut sorted: Vec<&(&str, String)> = params.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut text = format!("zsecure{call}");
    for (_, value) in sorted {
        text.push_str(value);
    }
    md5_hex(text.as_bytes())
}

fn cbc_encrypt(key: &[u8], plain: &[u8]) -> Result<Vec<u8>, WireError> {
    let iv = [0u8; 16];
    Ok(match key.len() {
        16 => cbc::Encryptor::<aes::Aes128>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        24 => cbc::Encryptor::<aes::Aes192>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        32 => cbc::Encryptor::<aes::Aes256>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        n => return Err(err(format!("an AES key of {n} bytes"))),
    })
}

fn cbc_decrypt(key: &[u8], data: &[u8]) -> Result<Vec<u8>, WireError> {
    let iv = [0u8; 16];
    let bad = |_| err("AES-CBC: wrong key or corrupt data");
    match key.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(bad),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(bad),
        32 => cbc::Decryptor::<aes::Aes256>::new_from_slices(key, &iv)
            .map_err(|e| err(e.to_string()))?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(bad),
        n => Err(err(format!("an AES key of {n} bytes"))),
    }
}

/// A session key: `zpw_enk` (base64 of the raw AES key).
#[derive(Clone)]
pub struct SessionKey(Vec<u8>);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    /// From the `zpw_enk` of a login.
    pub fn from_enk(enk: &str) -> Result<SessionKey, WireError> {
        let key = B64
            .decode(enk.trim())
            .map_err(|_| err("zpw_enk is not base64"))?;
        if ![16, 24, 32].contains(&key.len()) {
            return Err(err(format!("zpw_enk holds {} bytes", key.len())));
        }
        Ok(SessionKey(key))
    }

    /// The `zpw_enk` of this key.
    pub fn to_enk(&self) -> String {
        B64.encode(&self.0)
    }

    /// `encodeAES(secretKey, text)`.
    pub fn encrypt(&self, text: &str) -> String {
        // Key lengths are checked when the key is made.
        B64.encode(cbc_encrypt(&self.0, text.as_bytes()).unwrap_or_default())
    }

    /// `decodeAES(secretKey, data)`: URL-decoded, base64, AES-CBC.
    pub fn decrypt(&self, data: &str) -> Result<String, WireError> {
        decrypt_with(&self.0, data)
    }
}

fn decrypt_with(key: &[u8], data: &str) -> Result<String, WireError> {
    let data = percent_decode(data);
    let raw = B64
        .decode(data.trim())
        .map_err(|_| err("an encrypted field is not base64"))?;
    let plain = cbc_decrypt(key, &raw)?;
    String::from_utf8(plain).map_err(|_| err("decrypted data is not UTF-8"))
}

/// `decodeURIComponent` (what zca-js applies before base64-decoding).
pub fn percent_decode(data: &str) -> String {
    let bytes = data.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(h) = std::str::from_utf8(&bytes[i + 1..i + 3])
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The key of one login call (`getLoginInfo`), derived from its `zcid` and `zcid_ext`.
#[derive(Clone)]
pub struct LoginKey(String);

impl std::fmt::Debug for LoginKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoginKey(..)")
    }
}

fn evens(s: &str) -> Vec<char> {
    s.chars().step_by(2).collect()
}

fn odds(s: &str) -> Vec<char> {
    s.chars().skip(1).step_by(2).collect()
}

impl LoginKey {
    /// The key both sides derive from `zcid` and `zcid_ext`.
    pub fn derive(zcid: &str, zcid_ext: &str) -> Result<LoginKey, WireError> {
        let n = md5_hex(zcid_ext.as_bytes()).to_uppercase();
        let a = evens(&n);
        let b = evens(zcid);
        let mut c = odds(zcid);
        c.reverse();
        if a.len() < 8 || b.len() < 12 || c.len() < 12 {
            return Err(err("zcid is too short"));
        }
        let key: String = a[..8].iter().chain(&b[..12]).chain(&c[..12]).collect();
        Ok(LoginKey(key))
    }

    /// AES-CBC of `text` under this key, base64.
    pub fn encrypt(&self, text: &str) -> String {
        B64.encode(cbc_encrypt(self.0.as_bytes(), text.as_bytes()).unwrap_or_default())
    }

    /// The inverse of [`LoginKey::encrypt`].
    pub fn decrypt(&self, data: &str) -> Result<String, WireError> {
        decrypt_with(self.0.as_bytes(), data)
    }
}

/// `zcid`: upper-case hex of AES-CBC(`"<type>,<imei>,<first launch ms>"`) under the fixed key.
pub fn zcid(imei: &str, first_launch_ms: u64) -> String {
    let text = format!("{API_TYPE},{imei},{first_launch_ms}");
    hex(&cbc_encrypt(ZCID_KEY, text.as_bytes()).unwrap_or_default()).to_uppercase()
}

/// What `zcid` says: (type, imei, first launch ms).
pub fn open_zcid(zcid: &str) -> Result<(String, String, String), WireError> {
    let raw = (0..zcid.len())
        .step_by(2)
        .map(|i| {
            zcid.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| err("zcid is not hex"))?;
    let plain =
        String::from_utf8(cbc_decrypt(ZCID_KEY, &raw)?).map_err(|_| err("zcid is not UTF-8"))?;
    let mut parts = plain.splitn(3, ',').map(str::to_owned);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(t), Some(imei), Some(ts)) => Ok((t, imei, ts)),
        _ => Err(err("zcid is not type,imei,time")),
    }
}

/// A listener frame: header and JSON body.
pub fn encode_frame(version: u8, cmd: u16, sub_cmd: u8, body: &Value) -> Vec<u8> {
    let json = body.to_string();
    let mut out = Vec::with_capacity(4 + json.len());
    out.push(version);
    out.extend_from_slice(&cmd.to_le_bytes());
    out.push(sub_cmd);
    out.extend_from_slice(json.as_bytes());
    out
}

/// The header of a frame and its body (empty when the frame has none).
pub fn decode_frame(frame: &[u8]) -> Result<(u8, u16, u8, Option<Value>), WireError> {
    if frame.len() < 4 {
        return Err(err("a frame shorter than its 4-byte header"));
    }
    let cmd = u16::from_le_bytes([frame[1], frame[2]]);
    let body = &frame[4..];
    let body = if body.is_empty() {
        None
    } else {
        Some(serde_json::from_slice(body).map_err(|e| err(format!("frame body: {e}")))?)
    };
    Ok((frame[0], cmd, frame[3], body))
}

type Gcm128 = aes_gcm::AesGcm<aes::Aes128, U16>;
type Gcm256 = aes_gcm::AesGcm<aes::Aes256, U16>;

fn gcm(key: &[u8], iv: &[u8], aad: &[u8], data: &[u8], seal: bool) -> Result<Vec<u8>, WireError> {
    let nonce = aes_gcm::aead::generic_array::GenericArray::from_slice(iv);
    let payload = Payload { msg: data, aad };
    let out = match key.len() {
        16 => {
            let c = Gcm128::new_from_slice(key).map_err(|e| err(e.to_string()))?;
            if seal {
                c.encrypt(nonce, payload)
            } else {
                c.decrypt(nonce, payload)
            }
        }
        32 => {
            let c = Gcm256::new_from_slice(key).map_err(|e| err(e.to_string()))?;
            if seal {
                c.encrypt(nonce, payload)
            } else {
                c.decrypt(nonce, payload)
            }
        }
        n => return Err(err(format!("a cipher key of {n} bytes"))),
    };
    out.map_err(|_| err("AES-GCM: wrong cipher key or tampered frame"))
}

fn inflate(data: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(data)
        .read_to_end(&mut out)
        .map_err(|_| err("the frame is not zlib data"))?;
    Ok(out)
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// The payload of an event frame body (`decodeEventData`).
pub fn decode_event(body: &Value, cipher_key: Option<&str>) -> Result<Value, WireError> {
    let data = body
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| err("an event frame without a data string"))?;
    let encrypt = body
        .get("encrypt")
        .and_then(Value::as_i64)
        .ok_or_else(|| err("an event frame without an encrypt number"))?;
    let raw = match encrypt {
        0 => return serde_json::from_str(data).map_err(|e| err(e.to_string())),
        1 => B64.decode(data).map_err(|_| err("data is not base64"))?,
        2 | 3 => B64
            .decode(percent_decode(data))
            .map_err(|_| err("data is not base64"))?,
        n => return Err(err(format!("encrypt {n} is not 0-3"))),
    };
    let plain = if encrypt == 1 {
        raw
    } else {
        let key = cipher_key.ok_or_else(|| err("an encrypted frame before the cipher key"))?;
        let key = B64
            .decode(key)
            .map_err(|_| err("the cipher key is not base64"))?;
        if raw.len() < 48 {
            return Err(err("an encrypted frame shorter than 48 bytes"));
        }
        gcm(&key, &raw[..16], &raw[16..32], &raw[32..], false)?
    };
    let json = if encrypt == 3 {
        plain
    } else {
        inflate(&plain)?
    };
    serde_json::from_slice(&json).map_err(|e| err(format!("event JSON: {e}")))
}

/// An event frame body of `encrypt` 2 (what Zalo sends): zlib, AES-GCM under `cipher_key`
/// with `iv` and `aad`, base64.
pub fn encode_event(
    payload: &Value,
    cipher_key: &str,
    iv: [u8; 16],
    aad: [u8; 16],
) -> Result<Value, WireError> {
    let key = B64
        .decode(cipher_key)
        .map_err(|_| err("the cipher key is not base64"))?;
    let sealed = gcm(
        &key,
        &iv,
        &aad,
        &deflate(payload.to_string().as_bytes()),
        true,
    )?;
    let mut blob = Vec::with_capacity(32 + sealed.len());
    blob.extend_from_slice(&iv);
    blob.extend_from_slice(&aad);
    blob.extend_from_slice(&sealed);
    Ok(serde_json::json!({ "data": B64.encode(blob), "encrypt": 2 }))
}

/// base64 of `bytes` (keys the simulator hands out).
pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn login_key_round_trips_and_zcid_opens() {
        let z = zcid("imei-1", 1_700_000_000_000);
        assert!(
            z.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
        );
        assert_eq!(
            open_zcid(&z).unwrap(),
            ("30".into(), "imei-1".into(), "1700000000000".into())
        );
        let key = LoginKey::derive(&z, "a1b2c3").unwrap();
        assert_eq!(key.0.len(), 32);
        assert_eq!(key.decrypt(&key.encrypt("{\"x\":1}")).unwrap(), "{\"x\":1}");
        assert!(
            LoginKey::derive(&z, "other")
                .unwrap()
                .decrypt(&key.encrypt("{\"x\":1}"))
                .is_err()
        );
    }

    #[test]
    fn session_key_and_events_round_trip() {
        let key = SessionKey::from_enk(&b64(&[7u8; 16])).unwrap();
        let sealed = key.encrypt("{\"message\":\"hi\"}");
        assert_eq!(key.decrypt(&sealed).unwrap(), "{\"message\":\"hi\"}");
        let url_encoded = sealed.replace('+', "%2B").replace('/', "%2F");
        assert_eq!(key.decrypt(&url_encoded).unwrap(), "{\"message\":\"hi\"}");
        let cipher = b64(&[9u8; 32]);
        let payload = json!({ "data": { "msgs": [{ "msgId": "1" }] } });
        let body = encode_event(&payload, &cipher, [1; 16], [2; 16]).unwrap();
        assert_eq!(decode_event(&body, Some(&cipher)).unwrap(), payload);
        assert!(decode_event(&body, Some(&b64(&[8u8; 32]))).is_err());
        assert!(decode_event(&body, None).is_err());
        assert_eq!(
            decode_event(&json!({ "data": "{\"a\":1}", "encrypt": 0 }), None).unwrap(),
            json!({ "a": 1 })
        );
        let frame = encode_frame(1, 501, 0, &body);
        let (v, c, s, b) = decode_frame(&frame).unwrap();
        assert_eq!((v, c, s, b.unwrap()), (1, 501, 0, body));
        assert!(decode_frame(&[1, 2]).is_err());
    }

    #[test]
    fn sign_key_sorts_parameter_names() {
        let a = sign_key("getserverinfo", &[("b", "2".into()), ("a", "1".into())]);
        assert_eq!(a, md5_hex(b"zsecuregetserverinfo12"));
    }
}
