//! One node's view of a Redis Cluster: its `CLUSTER NODES` answer, parsed. Nodes are named by
//! their port (every node of a test cluster is on 127.0.0.1).

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

/// A line of `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <primary id or -> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot ranges...>`.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The id of the primary a replica follows.
    pub primary: Option<String>,
    pub connected: bool,
    /// Inclusive ranges; slots being migrated (`[slot->-id]`, `[slot-<-id]`) are left out.
    pub slots: Vec<(u16, u16)>,
}

impl Entry {
    fn parse(line: &str) -> Result<Self, String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(format!("short CLUSTER NODES line: {line:?}"));
        }
        let port = fields[1]
            .split('@')
            .next()
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| format!("no port in CLUSTER NODES line: {line:?}"))?;
        let mut slots = Vec::new();
        for range in fields[8..].iter().filter(|range| !range.starts_with('[')) {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let parse = |slot: &str| {
                slot.parse::<u16>()
                    .map_err(|_| format!("bad slot range {range:?} in {line:?}"))
            };
            slots.push((parse(first)?, parse(last)?));
        }
        Ok(Self {
            id: fields[0].to_owned(),
            port,
            flags: fields[2].split(',').map(str::to_owned).collect(),
            primary: (fields[3] != "-").then(|| fields[3].to_owned()),
            connected: fields[7] == "connected",
            slots,
        })
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|own| own == flag)
    }

    pub fn is_primary(&self) -> bool {
        self.has_flag("master")
    }

    /// Whether the viewer doubts this node: it failed, may have failed, or is not (yet) met.
    pub fn is_suspect(&self) -> bool {
        ["fail", "fail?", "handshake", "noaddr"]
            .iter()
            .any(|flag| self.has_flag(flag))
            || !self.connected
    }
}

/// The cluster as one node sees it.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub entries: Vec<Entry>,
}

/// What every node must agree on for the cluster to be stable: the primary serving each slot
/// range (by port), and the primary each given node follows (`None` for a primary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub owners: Vec<(u16, u16, u16)>,
    pub roles: BTreeMap<u16, Option<u16>>,
}

impl ClusterView {
    pub fn parse(text: &str) -> Result<Self, String> {
        let entries = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(Entry::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// The viewing node's own entry.
    pub fn myself(&self) -> &Entry {
        self.entries
            .iter()
            .find(|entry| entry.has_flag("myself"))
            .expect("CLUSTER NODES always lists the node itself")
    }

    pub fn entry(&self, port: u16) -> Option<&Entry> {
        self.entries.iter().find(|entry| entry.port == port)
    }

    fn port_of(&self, id: &str) -> Option<u16> {
        self.entries
            .iter()
            .find(|entry| entry.id == id)
            .map(|entry| entry.port)
    }

    /// The primary serving `slot`.
    pub fn owner_of(&self, slot: u16) -> Option<u16> {
        self.entries
            .iter()
            .find(|entry| {
                entry
                    .slots
                    .iter()
                    .any(|&(first, last)| (first..=last).contains(&slot))
            })
            .map(|entry| entry.port)
    }

    /// The primaries serving at least one slot, failed ones included, by port.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .entries
            .iter()
            .filter(|entry| entry.is_primary() && !entry.slots.is_empty())
            .map(|entry| entry.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The replicas following the node on `port`, by port.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let Some(primary) = self.entry(port) else {
            return Vec::new();
        };
        let mut ports: Vec<u16> = self
            .entries
            .iter()
            .filter(|entry| entry.primary.as_deref() == Some(primary.id.as_str()))
            .map(|entry| entry.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The slot ranges with their primary, and the roles of the nodes on `ports`.
    pub fn layout(&self, ports: &[u16]) -> Layout {
        let mut owners: Vec<(u16, u16, u16)> = self
            .entries
            .iter()
            .flat_map(|entry| {
                entry
                    .slots
                    .iter()
                    .map(|&(first, last)| (first, last, entry.port))
            })
            .collect();
        owners.sort_unstable();
        let roles = ports
            .iter()
            .map(|&port| {
                let primary = self.entry(port).and_then(|entry| entry.primary.as_deref());
                (port, primary.and_then(|id| self.port_of(id)))
            })
            .collect();
        Layout { owners, roles }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
d277 127.0.0.1:47005@48005 slave db7e 0 1795809661547 1 connected
3b23 127.0.0.1:47002@48002 master - 0 1795809661547 2 connected 5461-10922 [5461->-035d]
035d 127.0.0.1:47003@48003 master,fail - 0 1795809661045 3 disconnected 10923-16383 5460
db7e 127.0.0.1:47001@48001 myself,master - 0 1795809661000 1 connected 0-5459
";

    #[test]
    fn a_cluster_nodes_answer_is_read_line_by_line() {
        let view = ClusterView::parse(NODES).unwrap();
        assert_eq!(view.myself().port, 47001);
        assert_eq!(view.primaries(), [47001, 47002, 47003]);
        assert_eq!(view.replicas_of(47001), [47005]);
        assert_eq!(view.owner_of(0), Some(47001));
        assert_eq!(view.owner_of(5460), Some(47003));
        assert_eq!(
            view.owner_of(5461),
            Some(47002),
            "a migrating slot keeps its owner"
        );
        assert!(view.entry(47003).unwrap().is_suspect());
        assert!(!view.entry(47002).unwrap().is_suspect());
        let layout = view.layout(&[47005, 47001]);
        assert_eq!(layout.roles[&47005], Some(47001));
        assert_eq!(layout.roles[&47001], None);
        assert_eq!(layout.owners[0], (0, 5459, 47001));
    }

    #[test]
    fn a_line_without_a_port_is_an_error() {
        let error = ClusterView::parse("d277 nowhere slave - 0 0 1 connected").unwrap_err();
        assert!(error.contains("no port"), "{error}");
    }
}
