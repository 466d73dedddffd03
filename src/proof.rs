//! The service's proof that it knows the API token, for a client about to send it
//! (`POST /v1/proof`; the exchange is documented in docs/openapi.json, `proveService`).
//!
//! The client sends a fresh random nonce and nothing else; the service answers
//! `HMAC-SHA256(token, nonce || CONTEXT)` in hex. Only a process that holds the token can
//! answer, the answer is good for that one nonce only, and the context string keeps it from
//! meaning anything anywhere else: an impostor on the port learns the nonce, which is worth
//! nothing, and the client sends the token only after the answer checked out.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// What the MAC covers after the nonce: the purpose and its version.
pub const CONTEXT: &[u8] = b"hermes-hooks service proof v1";
/// Shortest and longest nonce accepted, in bytes (sent as 32 to 128 hex digits).
pub const NONCE_BYTES: std::ops::RangeInclusive<usize> = 16..=64;

/// Why a nonce is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum NonceError {
    /// Not hex.
    #[error("nonce is not hexadecimal: {0}")]
    NotHex(String),
    /// Too short to be fresh or longer than needed.
    #[error("nonce has {0} bytes; send 16 to 64 random bytes as hex")]
    Length(usize),
}

/// The nonce's bytes from its hex text.
pub fn parse_nonce(text: &str) -> Result<Vec<u8>, NonceError> {
    let bytes = hex::decode(text).map_err(|e| NonceError::NotHex(e.to_string()))?;
    if !NONCE_BYTES.contains(&bytes.len()) {
        return Err(NonceError::Length(bytes.len()));
    }
    Ok(bytes)
}

/// `HMAC-SHA256(token, nonce || CONTEXT)` as lowercase hex.
pub fn answer(token: &str, nonce: &[u8]) -> String {
    // HMAC accepts keys of any length; the error branch cannot happen but must not panic.
    match <Hmac<Sha256> as KeyInit>::new_from_slice(token.as_bytes()) {
        Ok(mut mac) => {
            mac.update(nonce);
            mac.update(CONTEXT);
            hex::encode(mac.finalize().into_bytes())
        }
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_is_the_hmac_of_nonce_and_context() {
        // Computed independently: python3 -c "import hmac,hashlib;
        // print(hmac.new(b'tok', bytes(16) + b'hermes-hooks service proof v1', hashlib.sha256).hexdigest())"
        assert_eq!(
            answer("tok", &[0u8; 16]),
            "dee3f1e483def819048a565d1d161415846523fa9db5f9daa099420367f2230a"
        );
        assert_ne!(answer("tok", &[0u8; 16]), answer("tok", &[1u8; 16]));
        assert_ne!(answer("tok", &[0u8; 16]), answer("tak", &[0u8; 16]));
    }

    #[test]
    fn nonces_are_hex_of_16_to_64_bytes() {
        assert_eq!(parse_nonce(&"ab".repeat(16)).unwrap().len(), 16);
        assert!(matches!(parse_nonce("zz"), Err(NonceError::NotHex(_))));
        assert!(matches!(parse_nonce("abcd"), Err(NonceError::Length(2))));
        assert!(matches!(
            parse_nonce(&"00".repeat(65)),
            Err(NonceError::Length(65))
        ));
    }
}
