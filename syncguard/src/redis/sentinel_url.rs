//! `redis+sentinel://` URLs: the Sentinels that know where a primary is, the name they know it
//! by, and how to log in to it. Only the structure is checked here; redis-rs checks each
//! address as it does a single server's.

// Without the `redis-sentinel` feature only the scheme is read, to name the feature.
#![cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]

use crate::error::LockError;

/// A Sentinel URL, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// One `redis://[sentinel credentials@]host:port` (or `rediss://`) per Sentinel, in order.
    pub(crate) sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary by (`sentinel monitor <name> ...`).
    pub(crate) master_name: String,
    /// The primary's and replicas' own address form, without a host: `redis://[credentials@]x/db`
    /// (or `rediss://`), from which their login and database are read.
    pub(crate) node_template: String,
    pub(crate) tls: bool,
}

const FORM: &str = "expected redis+sentinel://[user:password@]host:port[,host:port...]/<master \
    name>[/db][?sentinel_username=...&sentinel_password=...] (or rediss+sentinel:// for TLS): \
    the Sentinels' addresses, the name they monitor the primary by, the primary's login, and \
    the Sentinels' own login if they have one";

/// Whether `url` names Sentinels (its scheme is `redis+sentinel` or `rediss+sentinel`, or a
/// `valkey` form).
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    scheme_of(url).is_some()
}

/// `Some(tls)` for a Sentinel scheme.
fn scheme_of(url: &str) -> Option<bool> {
    let (scheme, _) = url.split_once("://")?;
    match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" | "valkey+sentinel" => Some(false),
        "rediss+sentinel" | "valkeys+sentinel" => Some(true),
        _ => None,
    }
}

/// Parses a Sentinel URL. Never quotes the URL in an error: it may hold a password.
///
/// # Errors
/// `InvalidArgument` saying what is wrong and what is accepted.
pub(crate) fn parse_sentinel_url(url: &str) -> Result<SentinelUrl, LockError> {
    let invalid = |what: &str| LockError::invalid_argument(format!("{what}; {FORM}"));
    let tls = scheme_of(url).ok_or_else(|| invalid("not a Redis Sentinel URL"))?;
    let (_, rest) = url.split_once("://").expect("scheme_of found it");
    if rest.contains('#') {
        return Err(invalid("a Redis Sentinel URL takes no fragment"));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut segments = path.split('/');
    let master_name = segments.next().unwrap_or_default();
    if master_name.is_empty() {
        return Err(invalid(
            "the Redis Sentinel URL names no primary (the path's first part)",
        ));
    }
    if !master_name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(invalid(
            "the primary's name holds a character other than ASCII letters, digits and - _ .",
        ));
    }
    let db = match (segments.next(), segments.next()) {
        (None | Some(""), None) => "0",
        (Some(db), None) if !db.is_empty() && db.bytes().all(|b| b.is_ascii_digit()) => db,
        _ => {
            return Err(invalid(
                "the Redis Sentinel URL's path is /<master name>[/db]",
            ));
        }
    };
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, authority),
    };
    let sentinel_login = sentinel_login(query).map_err(|what| invalid(&what))?;
    let scheme = if tls { "rediss" } else { "redis" };
    let sentinels = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(invalid(
                    "the Redis Sentinel URL has an empty Sentinel address",
                ));
            }
            if host.contains(['@', ' ']) {
                return Err(invalid(
                    "a Sentinel address of the URL holds '@' or a space",
                ));
            }
            Ok(match &sentinel_login {
                Some(login) => format!("{scheme}://{login}@{host}"),
                None => format!("{scheme}://{host}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let node_template = match credentials {
        Some(credentials) => format!("{scheme}://{credentials}@primary/{db}"),
        None => format!("{scheme}://primary/{db}"),
    };
    Ok(SentinelUrl {
        sentinels,
        master_name: master_name.to_owned(),
        node_template,
        tls,
    })
}

/// The Sentinels' own login from the query (`sentinel_username`, `sentinel_password`), as URL
/// credentials (`user:password`, or `:password`), if any.
fn sentinel_login(query: Option<&str>) -> Result<Option<String>, String> {
    let (mut username, mut password) = (None, None);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "sentinel_username" => &mut username,
            "sentinel_password" => &mut password,
            _ => {
                return Err(
                    "the Redis Sentinel URL's query takes only sentinel_username and \
                     sentinel_password"
                        .to_owned(),
                );
            }
        };
        if value.is_empty() || value.contains(['@', '/', ':', ' ']) {
            return Err(format!(
                "{name} is empty or holds an unencoded '@', '/', ':' or space (percent-encode it)"
            ));
        }
        *slot = Some(value);
    }
    Ok(match (username, password) {
        (None, None) => None,
        (Some(_), None) => {
            return Err("sentinel_username needs sentinel_password".to_owned());
        }
        (username, Some(password)) => Some(format!("{}:{password}", username.unwrap_or(""))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_get_their_own_login_and_the_primary_the_url_s() {
        let parsed = parse_sentinel_url(
            "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2:26379/locks/2\
             ?sentinel_password=s3nt%21nel",
        )
        .unwrap();
        assert_eq!(
            parsed.sentinels,
            [
                "redis://:s3nt%21nel@10.0.0.1:26379",
                "redis://:s3nt%21nel@10.0.0.2:26379"
            ]
        );
        assert_eq!(parsed.master_name, "locks");
        assert_eq!(parsed.node_template, "redis://app:s%40cret@primary/2");
        assert!(!parsed.tls);

        let tls = parse_sentinel_url("rediss+sentinel://[::1]:26379/mymaster").unwrap();
        assert_eq!(tls.sentinels, ["rediss://[::1]:26379"]);
        assert_eq!(tls.node_template, "rediss://primary/0");
        assert!(tls.tls);
        let both = parse_sentinel_url(
            "redis+sentinel://h:1/m/?sentinel_username=watch&sentinel_password=pw",
        )
        .unwrap();
        assert_eq!(both.sentinels, ["redis://watch:pw@h:1"]);
        assert!(is_sentinel_url("REDIS+SENTINEL://h:1/m"));
        assert!(!is_sentinel_url("redis://h:1"));
    }

    #[test]
    fn malformed_sentinel_urls_are_refused_without_quoting_them() {
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://:hunter2@h:1,,h:2/m",
            "redis+sentinel://h:1/m/x",
            "redis+sentinel://h:1/m/1/2",
            "redis+sentinel://h:1/m%20x",
            "redis+sentinel://h:1/m?protocol=resp3",
            "redis+sentinel://h:1/m?sentinel_username=u",
            "redis+sentinel://h:1/m?sentinel_password=",
            "redis+sentinel://h:1/m#frag",
            "redis://h:1",
        ] {
            let error = parse_sentinel_url(bad).unwrap_err();
            assert_eq!(error.code(), crate::ErrorCode::InvalidArgument, "{bad}");
            assert!(error.to_string().contains("redis+sentinel://"), "{error}");
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
    }
}
