//! `redis-cluster://` URLs: the seed nodes of a Redis Cluster, each turned into the plain
//! `redis://` (or `rediss://`) URL redis-rs connects to. Only the structure is checked here;
//! redis-rs checks each node URL as it does a single server's.

use crate::error::LockError;

/// A cluster URL, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ClusterUrl {
    /// One `redis://[user:password@]host:port` (or `rediss://`) per seed node, in order.
    pub(crate) nodes: Vec<String>,
    pub(crate) tls: bool,
}

const FORM: &str = "expected redis-cluster://[user:password@]host:port[,host:port...] (or \
    rediss-cluster:// for TLS): the addresses of one or more nodes of the cluster, which finds \
    the others itself";

/// Whether `url` names a cluster (its scheme is `redis-cluster` or `rediss-cluster`).
pub(crate) fn is_cluster_url(url: &str) -> bool {
    scheme_of(url).is_some()
}

/// `Some(tls)` for a cluster scheme.
fn scheme_of(url: &str) -> Option<bool> {
    let (scheme, _) = url.split_once("://")?;
    match scheme.to_ascii_lowercase().as_str() {
        "redis-cluster" | "valkey-cluster" => Some(false),
        "rediss-cluster" | "valkeys-cluster" => Some(true),
        _ => None,
    }
}

/// Parses a cluster URL. Never quotes the URL in an error: it may hold a password.
///
/// # Errors
/// `InvalidArgument` saying what is wrong and what is accepted.
pub(crate) fn parse_cluster_url(url: &str) -> Result<ClusterUrl, LockError> {
    let invalid = |what: &str| LockError::invalid_argument(format!("{what}; {FORM}"));
    let tls = scheme_of(url).ok_or_else(|| invalid("not a Redis Cluster URL"))?;
    let (_, rest) = url.split_once("://").expect("scheme_of found it");
    // The node list ends at the path or query, whichever comes first.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if !matches!(tail, "" | "/" | "/0") {
        return Err(invalid(
            "a Redis Cluster URL takes no path or query (a cluster has only database 0)",
        ));
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, authority),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let nodes = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(invalid("the Redis Cluster URL has an empty node address"));
            }
            if host.contains(['@', ' ']) {
                return Err(invalid(
                    "a node address of the Redis Cluster URL holds '@' or a space",
                ));
            }
            Ok(match credentials {
                Some(credentials) => format!("{scheme}://{credentials}@{host}"),
                None => format!("{scheme}://{host}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterUrl { nodes, tls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_share_the_credentials_and_the_scheme() {
        let parsed =
            parse_cluster_url("redis-cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001/").unwrap();
        assert_eq!(
            parsed.nodes,
            [
                "redis://app:s%40cret@10.0.0.1:7000",
                "redis://app:s%40cret@10.0.0.2:7001"
            ]
        );
        assert!(!parsed.tls);
        let tls = parse_cluster_url("rediss-cluster://[::1]:7000").unwrap();
        assert_eq!(tls.nodes, ["rediss://[::1]:7000"]);
        assert!(tls.tls);
        assert!(is_cluster_url("REDIS-CLUSTER://h:1"));
        assert!(!is_cluster_url("redis://h:1"));
    }

    #[test]
    fn malformed_cluster_urls_are_refused_without_quoting_them() {
        for bad in [
            "redis-cluster://",
            "redis-cluster://a:1,,b:2",
            "redis-cluster://a:1,b:2/3",
            "redis-cluster://a:1?protocol=resp3",
            "redis-cluster://user:hunter2@a:1/x",
            "redis://a:1",
        ] {
            let error = parse_cluster_url(bad).unwrap_err();
            assert_eq!(error.code(), crate::ErrorCode::InvalidArgument, "{bad}");
            assert!(error.to_string().contains("redis-cluster://"), "{error}");
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
    }
}
