//! Signing keys: an id and a secret. The secret never appears in `Debug` output.

use std::fmt;

/// Longest key id accepted.
pub(crate) const MAX_ID_LEN: usize = 64;

/// A secret with the id tokens name it by (`kid=`) and errors and logs call it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    id: Box<str>,
    secret: Box<[u8]>,
}

/// A key that cannot be used; the message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The id is empty, too long, or has a character outside `A-Z a-z 0-9 - . _`.
    BadId(String),
    /// The secret is empty.
    EmptySecret(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::BadId(id) => {
                write!(f, "key id `{id}`: must be 1 to {MAX_ID_LEN} of the characters A-Z a-z 0-9 - . _")
            }
            KeyError::EmptySecret(id) => write!(f, "key `{id}`: the secret is empty"),
        }
    }
}

impl std::error::Error for KeyError {}

impl Key {
    /// A key named `id` (the characters `A-Z a-z 0-9 - . _`, at most 64, so it can sit in
    /// a URL and a metric label as itself) with a non-empty `secret`.
    pub fn new(id: impl Into<String>, secret: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        let id = id.into();
        if !valid_id(id.as_bytes()) {
            return Err(KeyError::BadId(id));
        }
        let secret = secret.into();
        if secret.is_empty() {
            return Err(KeyError::EmptySecret(id));
        }
        Ok(Key { id: id.into(), secret: secret.into() })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn secret(&self) -> &[u8] {
        &self.secret
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key").field("id", &self.id).field("secret", &"<redacted>").finish()
    }
}

pub(crate) fn valid_id(id: &[u8]) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len()) && id.iter().all(|&b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// The first id used twice, if any.
pub(crate) fn duplicate_id(keys: &[Key]) -> Option<&str> {
    keys.iter().enumerate().find(|(i, key)| keys[..*i].iter().any(|k| k.id == key.id)).map(|(_, key)| key.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for good in ["k1", "2026-05.a_b", &"x".repeat(64)] {
            assert!(Key::new(good, b"s".to_vec()).is_ok(), "{good}");
        }
        for bad in ["", "k 1", "k~1", "k=1", "ключ", &"x".repeat(65)] {
            assert_eq!(Key::new(bad, b"s".to_vec()), Err(KeyError::BadId(bad.to_string())));
        }
        assert_eq!(Key::new("k1", Vec::new()), Err(KeyError::EmptySecret("k1".into())));
        assert_eq!(KeyError::EmptySecret("k1".into()).to_string(), "key `k1`: the secret is empty");
    }

    #[test]
    fn debug_hides_the_secret() {
        let key = Key::new("k1", b"hunter2-hunter2".to_vec()).unwrap();
        let shown = format!("{key:?}");
        assert!(shown.contains("k1") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn duplicates() {
        let k = |id: &str| Key::new(id, b"s".to_vec()).unwrap();
        assert_eq!(duplicate_id(&[k("a"), k("b"), k("c")]), None);
        assert_eq!(duplicate_id(&[k("a"), k("b"), k("a")]), Some("a"));
    }
}
