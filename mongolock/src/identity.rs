//! Who holds a lock: host, process and a per-instance id.

use std::fmt;

/// The identity of a lock client: host name, process id and a random id unique to
/// this instance. Each acquisition adds a sequence number, so a late or retried
/// request of one acquisition can never be mistaken for another's.
///
/// ```
/// let me = mongolock::Identity::current();
/// assert_eq!(me.pid(), std::process::id());
/// assert!(me.to_string().starts_with(me.host()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    host: String,
    pid: u32,
    instance: String,
}

impl Identity {
    /// This process on this host, with a fresh instance id.
    pub fn current() -> Self {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        Identity::new(if host.is_empty() { "unknown-host".into() } else { host }, std::process::id())
    }

    /// An identity with an explicit host and pid (and a fresh instance id).
    pub fn new(host: impl Into<String>, pid: u32) -> Self {
        let instance = format!("{:08x}", fastrand::u32(..));
        Identity { host: host.into().replace('/', "_"), pid, instance }
    }

    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The per-instance id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The owner string of acquisition number `seq`.
    pub(crate) fn owner(&self, seq: u64) -> String {
        format!("{self}/{seq}")
    }

    /// Whether `owner` (a holder's owner string) names an acquisition of this
    /// instance.
    pub fn is_mine(&self, owner: &str) -> bool {
        owner.strip_prefix(&self.to_string()).is_some_and(|rest| rest.starts_with('/'))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.host, self.pid, self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_per_acquisition() {
        let a = Identity::new("h/x", 7);
        let b = Identity::new("h/x", 7);
        assert_ne!(a, b, "instances differ");
        assert!(a.is_mine(&a.owner(3)));
        assert!(!a.is_mine(&b.owner(3)));
        assert!(!a.is_mine(&format!("{a}0/1")));
        assert_eq!(a.host(), "h_x");
    }
}
