//! Key templates: `"job:{id}"`, `"{self.tenant}:{order.id}"`, `"{{literal}}"`.

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied as is.
    Text(String),
    /// A value formatted with `Display`: a parameter (or `self`) and a field path.
    Value { root: String, path: Vec<String> },
}

/// Splits a template into text and placeholders.
pub(crate) fn parse(template: &str) -> Result<Vec<Segment>, String> {
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => return Err("unmatched `}` in the key; write `}}` for a literal brace".into()),
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err(
                                "unclosed `{` in the key; close it, or write `{{` for a literal brace"
                                    .into(),
                            );
                        }
                    }
                }
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(placeholder(&inner)?);
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

fn placeholder(inner: &str) -> Result<Segment, String> {
    if inner.is_empty() {
        return Err("empty `{}` in the key; name a parameter, e.g. `{id}`".into());
    }
    let mut parts = inner.split('.');
    let root = parts.next().unwrap_or_default();
    if !is_identifier(root) {
        return Err(format!(
            "`{{{inner}}}` in the key: placeholders are a parameter name with an optional field path, e.g. `{{id}}`, `{{order.id}}`, `{{self.tenant}}`"
        ));
    }
    let path: Vec<String> = parts.map(str::to_owned).collect();
    if let Some(bad) = path
        .iter()
        .find(|p| !is_identifier(p) && !is_tuple_index(p))
    {
        return Err(format!(
            "`{{{inner}}}` in the key: `{bad}` is not a field name or tuple index"
        ));
    }
    Ok(Segment::Value {
        root: root.to_owned(),
        path,
    })
}

fn is_tuple_index(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(root: &str, path: &[&str]) -> Segment {
        Segment::Value {
            root: root.into(),
            path: path.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    #[test]
    fn text_placeholders_and_escapes() {
        assert_eq!(
            parse("job:{id}:{self.tenant.name}:{{x}}:{pair.0}").unwrap(),
            vec![
                Segment::Text("job:".into()),
                value("id", &[]),
                Segment::Text(":".into()),
                value("self", &["tenant", "name"]),
                Segment::Text(":{x}:".into()),
                value("pair", &["0"]),
            ]
        );
        assert_eq!(parse("plain").unwrap(), vec![Segment::Text("plain".into())]);
    }

    #[test]
    fn malformed_templates() {
        for bad in [
            "{", "}", "a{b", "{}", "{a b}", "{1x}", "{a.}", "{a..b}", "{a.b-c}",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
