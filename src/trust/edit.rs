//! The `enabled:` editor: sets the top-level `enabled:` of a HOOK.yaml text by editing that one
//! value, so comments, order and quoting stay byte for byte as they were. A leaf.

/// Sets the top-level `enabled:` of a HOOK.yaml text by editing only its value (comments, order,
/// quoting and line endings stay as they were), or appends `enabled: false` when the key is
/// absent. `None` when the text already says so (absent counts as `true`).
pub fn edit_enabled(text: &str, on: bool) -> Option<String> {
    let value = if on { "true" } else { "false" };
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let Some(rest) = ["enabled", "\"enabled\"", "'enabled'"]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        else {
            continue;
        };
        let after_key = rest.trim_start_matches([' ', '\t']);
        let Some(after_colon) = after_key.strip_prefix(':') else {
            continue;
        };
        // Where the value starts and ends within `line` (before a comment or the line end).
        let colon_at = line.len() - after_colon.len();
        let value_start =
            colon_at + (after_colon.len() - after_colon.trim_start_matches([' ', '\t']).len());
        let body_end = line.trim_end_matches(['\n', '\r']).len();
        let mut value_end = body_end;
        let bytes = line.as_bytes();
        for i in value_start..body_end {
            if bytes[i] == b'#' && i > 0 && matches!(bytes[i - 1], b' ' | b'\t') {
                value_end = i;
                break;
            }
        }
        let current = line[value_start..value_end].trim_end_matches([' ', '\t']);
        value_end = value_start + current.len();
        if current == value {
            return None;
        }
        if current.is_empty() {
            // `enabled:` with the value elsewhere: not a one-line edit; the caller's check fails.
            let mut out = text.to_string();
            out.insert_str(start + colon_at, &format!(" {value}"));
            return Some(out);
        }
        let mut out = String::with_capacity(text.len() + 1);
        out.push_str(&text[..start + value_start]);
        out.push_str(value);
        out.push_str(&text[start + value_end..]);
        return Some(out);
    }
    if on {
        return None;
    }
    let eol = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push_str(eol);
    }
    out.push_str("enabled: false");
    out.push_str(eol);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_only_the_value() {
        let t = "# my hook\nname: x   # the name\nevents: [a]\nenabled: true    # keep me\n";
        assert_eq!(
            edit_enabled(t, false).unwrap(),
            "# my hook\nname: x   # the name\nevents: [a]\nenabled: false    # keep me\n"
        );
        assert_eq!(edit_enabled(t, true), None);
        let crlf = "events: [a]\r\nenabled: false\r\n";
        assert_eq!(
            edit_enabled(crlf, true).unwrap(),
            "events: [a]\r\nenabled: true\r\n"
        );
        assert_eq!(
            edit_enabled("'enabled' : no # x\nevents: [a]", true).unwrap(),
            "'enabled' : true # x\nevents: [a]"
        );
    }

    #[test]
    fn appends_when_absent() {
        assert_eq!(edit_enabled("events: [a]", true), None);
        assert_eq!(
            edit_enabled("events: [a] # c", false).unwrap(),
            "events: [a] # c\nenabled: false\n"
        );
        // Indented keys (inside another mapping) are not the top-level one.
        assert_eq!(
            edit_enabled("events: [a]\nenv:\n  enabled: true\n", false).unwrap(),
            "events: [a]\nenv:\n  enabled: true\nenabled: false\n"
        );
    }
}
