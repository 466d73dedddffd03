//! Leaf: text made safe to log, store and show: [`cap`] bounds an error text a handler produced,
//! [`redact_url`] keeps a URL's secrets (user info, path, query) out of listings, [`closest`]
//! finds the word a typo was meant to be.

/// Most bytes of a handler's error text that are logged or stored.
pub const MAX_ERROR_TEXT: usize = 4096;

/// `text` cut to at most [`MAX_ERROR_TEXT`] bytes (on a character boundary), saying how much was
/// cut.
pub fn cap(text: String) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes cut)", &text[..end], text.len() - end)
}

/// A URL as shown to operators: scheme, host and port only; a path or query (which may carry a
/// token) becomes `/…`, user info is dropped. Text that does not parse is shown as `<invalid url>`.
pub fn redact_url(url: &str) -> String {
    let Ok(u) = reqwest::Url::parse(url) else {
        return "<invalid url>".into();
    };
    let mut out = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(port) = u.port() {
        out.push_str(&format!(":{port}"));
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        out.push_str("/…");
    }
    out
}

/// The word of `known` that `typo` was probably meant to be: the nearest by edit distance when
/// at most a third of the typo's length away (at least 1, at most 3 edits). `None` for an exact
/// match or nothing close.
pub fn closest<'a>(typo: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (typo.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (strsim::levenshtein(typo, k), *k))
        .filter(|(d, _)| *d > 0 && *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_on_a_char_boundary() {
        let long = "é".repeat(5000);
        let c = cap(long);
        assert!(c.len() < MAX_ERROR_TEXT + 40, "{}", c.len());
        assert!(c.ends_with("more bytes cut)"));
        assert_eq!(cap("short".into()), "short");
    }

    #[test]
    fn redacts_secrets() {
        assert_eq!(
            redact_url("https://u:p@hooks.example:8443/t/SECRET?key=abc"),
            "https://hooks.example:8443/…"
        );
        assert_eq!(redact_url("http://127.0.0.1:9/"), "http://127.0.0.1:9");
        assert_eq!(redact_url("nope"), "<invalid url>");
    }
}
