//! Moving a hash slot from its primary to another, step by step, as the Redis Cluster
//! specification describes (and `redis-cli --cluster reshard` does), so that a test can act
//! while the slot is half-moved.

use super::{COMMAND_TIMEOUT, Node, RedisCluster, SLOTS};

/// How many keys one `MIGRATE` moves at most while finishing.
const KEYS_PER_MIGRATE: usize = 100;

/// A slot on its way from its primary (the source) to another (the target): the target
/// has it `IMPORTING`, the source `MIGRATING`. Meanwhile the source answers a command on a key
/// it no longer has with `ASK <target>`, and the target answers it only after `ASKING`; other
/// clients of the target get `MOVED <source>`.
///
/// ```ignore
/// let migration = cluster.begin_migration(slot, target).await;
/// migration.move_key("lock:{orders}").await; // on the target now; the source answers ASK
/// // ... the test acts on the half-moved slot ...
/// migration.finish().await; // every key moved, the slot the target's everywhere
/// ```
#[must_use = "a migration left unfinished leaves its slot half-moved"]
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    source: Node,
    target: Node,
}

impl<'a> SlotMigration<'a> {
    pub(super) async fn begin(cluster: &'a RedisCluster, slot: u16, target: Node) -> Self {
        assert!(slot < SLOTS, "slot {slot} is past the last, {}", SLOTS - 1);
        let view = cluster
            .view_of(target)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let target_entry = view.myself();
        assert!(
            target_entry.is_primary(),
            "{target} cannot take slot {slot}: it is no primary ({})",
            target_entry.flags.join(",")
        );
        let source = Node {
            port: (view.owner_of(slot))
                .unwrap_or_else(|| panic!("{target} sees no owner of slot {slot}")),
        };
        assert_ne!(source, target, "{target} serves slot {slot} already");
        let source_id = view
            .entry(source.port)
            .expect("the owner is listed")
            .id
            .clone();
        let target_id = target_entry.id.clone();
        let migration = Self {
            cluster,
            slot,
            source,
            target,
        };
        // The target first: once the source is MIGRATING, it sends clients there with ASK.
        migration.set_slot(target, &["IMPORTING", &source_id]).await;
        migration.set_slot(source, &["MIGRATING", &target_id]).await;
        migration
    }

    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The primary the slot comes from.
    pub fn source(&self) -> Node {
        self.source
    }

    /// The primary the slot goes to.
    pub fn target(&self) -> Node {
        self.target
    }

    /// Moves up to `limit` of the keys the source still has in the slot; returns how many.
    pub async fn move_keys(&self, limit: usize) -> usize {
        let mut command = redis::cmd("CLUSTER");
        command.arg("GETKEYSINSLOT").arg(self.slot).arg(limit);
        let keys: Vec<Vec<u8>> = (self.cluster.query(self.source, &command).await)
            .unwrap_or_else(|e| panic!("CLUSTER GETKEYSINSLOT on {}: {e}", self.source));
        if !keys.is_empty() {
            self.migrate(&keys).await;
        }
        keys.len()
    }

    /// Moves `key`, which must be in the slot and still on the source.
    pub async fn move_key(&self, key: &str) {
        let slot = self.cluster.slot_of(key).await;
        assert_eq!(
            slot, self.slot,
            "{key:?} is in slot {slot}, not in {}",
            self.slot
        );
        self.migrate(&[key.as_bytes().to_vec()]).await;
    }

    async fn migrate(&self, keys: &[Vec<u8>]) {
        let mut command = redis::cmd("MIGRATE");
        command
            .arg("127.0.0.1")
            .arg(self.target.port())
            .arg("") // the empty key: the keys come after KEYS
            .arg(0)
            .arg(COMMAND_TIMEOUT.as_millis() as u64)
            .arg("KEYS")
            .arg(keys);
        let answer: String =
            (self.cluster.query(self.source, &command).await).unwrap_or_else(|e| {
                panic!(
                    "MIGRATE of {} keys of slot {} from {} to {}: {e}",
                    keys.len(),
                    self.slot,
                    self.source,
                    self.target
                )
            });
        assert_eq!(
            answer, "OK",
            "MIGRATE found none of the keys on {}",
            self.source
        );
    }

    /// Moves the keys left, gives the slot to the target (`CLUSTER SETSLOT <slot> NODE` on the
    /// target, the source, then the other primaries), and waits until every node agrees.
    pub async fn finish(self) {
        let (cluster, slot, target) = (self.cluster, self.slot, self.target);
        let target_id = cluster
            .view_of(target)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .myself()
            .id
            .clone();
        let give = ["NODE", target_id.as_str()];
        cluster
            .wait_until(
                &format!("{} to let slot {slot} go", self.source),
                async || {
                    while self.move_keys(KEYS_PER_MIGRATE).await > 0 {}
                    self.set_slot_or_say(target, &give).await?;
                    // Refused while the source still has a key of the slot, written since.
                    self.set_slot_or_say(self.source, &give).await
                },
            )
            .await;
        for primary in cluster.primaries().await {
            if primary != self.source && primary != target && cluster.reachable().contains(&primary)
            {
                self.set_slot(primary, &give).await;
            }
        }
        cluster
            .wait_until(
                &format!("every node to see slot {slot} on {target}"),
                async || {
                    cluster.stability().await?;
                    let owner = cluster.view_from_any().await?.owner_of(slot);
                    match owner {
                        Some(port) if port == target.port() => Ok(()),
                        owner => Err(format!("slot {slot} is on {owner:?}")),
                    }
                },
            )
            .await;
    }

    async fn set_slot(&self, node: Node, how: &[&str]) {
        self.set_slot_or_say(node, how)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn set_slot_or_say(&self, node: Node, how: &[&str]) -> Result<(), String> {
        let mut command = redis::cmd("CLUSTER");
        command.arg("SETSLOT").arg(self.slot).arg(how);
        self.cluster.query::<()>(node, &command).await.map_err(|e| {
            format!(
                "CLUSTER SETSLOT {} {} on {node}: {e}",
                self.slot,
                how.join(" ")
            )
        })
    }
}
