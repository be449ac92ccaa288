//! Who leads: this node's role, and the leadership as this node last observed
//! it (what [`crate::Elector::leadership`] publishes).

use mongolock::LockInfo;

/// This node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It holds the leadership lease.
    Leader,
    /// It does not.
    Follower,
}

/// Who leads, as this node last observed it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The leader, if any (owner, host, pid, since, expiry, fence).
    pub leader: Option<LockInfo>,
    /// Whether this node is the leader.
    pub is_me: bool,
}
