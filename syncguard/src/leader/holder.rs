//! How a candidate is written into the lock it takes, and read back by observers: its
//! identity and a nonce of its campaign, as the holder of [`LockBackend::acquire_as`].
//!
//! The holder is the JSON object `{"leader":"<identity>","campaign":"<nonce>"}` (keys in this
//! order, no spaces), so that any client of the store (a TypeScript service, `redis-cli`, a
//! SQL console) can read who leads. The nonce makes every campaign a holder of its own: two
//! candidates with the same identity never share a lock through `acquire_as`'s re-entrancy.
//!
//! [`LockBackend::acquire_as`]: crate::backend::LockBackend::acquire_as

const LEADER_FIELD: &str = r#"{"leader":"#;
const CAMPAIGN_FIELD: &str = r#","campaign":"#;

/// The holder of a campaign by `identity` (checked by
/// [`check_identity`](super::identity::check_identity)) with `nonce`.
pub(super) fn encode(identity: &str, nonce: &str) -> String {
    let mut holder = String::with_capacity(identity.len() + nonce.len() + 32);
    holder.push_str(LEADER_FIELD);
    push_json_string(&mut holder, identity);
    holder.push_str(CAMPAIGN_FIELD);
    push_json_string(&mut holder, nonce);
    holder.push('}');
    holder
}

/// The identity written by [`encode`]; `None` for a holder written otherwise.
pub(super) fn decode_identity(holder: &str) -> Option<String> {
    let rest = holder.strip_prefix(LEADER_FIELD)?;
    let (identity, rest) = json_string(rest)?;
    let rest = rest.strip_prefix(CAMPAIGN_FIELD)?;
    let (_nonce, rest) = json_string(rest)?;
    (rest == "}").then_some(identity)
}

/// Appends `text` as a JSON string. Identities have no control characters; nonces are lock
/// ids (base64url): only quotes and backslashes need escaping, but every control character
/// is escaped anyway, so the output is JSON whatever it is given.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() && u32::from(c) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Reads the JSON string at the start of `text`: its value and what follows it. Every JSON
/// escape is understood, so a holder written by another client of the store reads back too.
fn json_string(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('"')?.char_indices();
    let body = &text[1..];
    let mut value = String::new();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((value, &body[at + 1..])),
            '\\' => {
                let (_, escape) = chars.next()?;
                let unescaped = match escape {
                    '"' => '"',
                    '\\' => '\\',
                    '/' => '/',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'u' => {
                        let high = hex4(&mut chars)?;
                        if (0xD800..0xDC00).contains(&high) {
                            // A surrogate pair: `\uD83D\uDE00`.
                            if chars.next()?.1 != '\\' || chars.next()?.1 != 'u' {
                                return None;
                            }
                            let low = hex4(&mut chars)?;
                            if !(0xDC00..0xE000).contains(&low) {
                                return None;
                            }
                            char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
                        } else {
                            char::from_u32(high)?
                        }
                    }
                    _ => return None,
                };
                value.push(unescaped);
            }
            c if u32::from(c) < 0x20 => return None,
            c => value.push(c),
        }
    }
    None
}

fn hex4(chars: &mut std::str::CharIndices<'_>) -> Option<u32> {
    let mut value = 0;
    for _ in 0..4 {
        value = value * 16 + chars.next()?.1.to_digit(16)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MAX_HOLDER_BYTES, check_holder};
    use crate::leader::identity::{MAX_IDENTITY_BYTES, check_identity};

    #[test]
    fn identities_round_trip_through_the_holder() {
        for identity in [
            "web-1:4242",
            "quote\" and backslash\\",
            "ünïcödé 🦀",
            &"\"".repeat(MAX_IDENTITY_BYTES),
        ] {
            check_identity(identity).unwrap();
            let holder = encode(identity, "AAAAAAAAAAAAAAAAAAAAAA");
            check_holder(&holder).unwrap();
            assert!(holder.len() <= MAX_HOLDER_BYTES);
            assert_eq!(
                decode_identity(&holder).as_deref(),
                Some(identity),
                "{holder}"
            );
        }
        assert_eq!(
            encode("a", "n"),
            r#"{"leader":"a","campaign":"n"}"#,
            "the documented format"
        );
    }

    #[test]
    fn holders_written_by_others_decode_with_every_json_escape() {
        let holder = r#"{"leader":"a\/b\n\u00e9\ud83e\udd80","campaign":"x"}"#;
        assert_eq!(decode_identity(holder).as_deref(), Some("a/b\né🦀"));
        for other in [
            "",
            "web-1",
            r#"{"owner":"svc","instanceId":"w-1"}"#,
            r#"{"leader":"a","campaign":"n"} "#,
            r#"{"leader":"a","campaign":"n""#,
            r#"{"leader":"a\q","campaign":"n"}"#,
            r#"{"leader":"\ud83e","campaign":"n"}"#,
            r#"{"leader":"a"}"#,
        ] {
            assert_eq!(decode_identity(other), None, "{other}");
        }
    }
}
