//! The names the chaos run's processes share: the lock, the election, the
//! queue and the ledgers the workers use and the checker reads, and how many
//! tasks the orchestrator seeds.

/// The workers' lock, and the ledger its holders write with their fence.
pub(super) const LOCK: &str = "chaos-lock";
pub(super) const LEDGER: &str = "chaos_ledger";
/// The workers' election.
pub(super) const ELECTION: &str = "chaos-leader";
/// The workers' queue (the pipeline of seeded tasks and their follow-ups).
pub(super) const QUEUE: &str = "chaos_tasks";
/// The lock the forking runners (`mongocoord lock`) contend for, and their ledger.
pub(super) const FORK_LOCK: &str = "chaos-fork-lock";
pub(super) const FORK_LEDGER: &str = "chaos_fork_ledger";
/// Tasks seeded into [`QUEUE`] (`seed-<i>`).
pub(super) const SEEDED: u32 = 150;
