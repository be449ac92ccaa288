//! Values that belong to the process that made them.
//!
//! A child forked after the runtime started (multiprocessing's default `fork`
//! start method on Linux) has a copy of the parent's memory but none of its
//! threads: the runtime's workers, the drivers' connection pools, the locks'
//! keepers stayed behind, and the child shares the parent's sockets. Touching
//! any of it there (even dropping it: a drop wakes tasks, which takes the
//! scheduler's locks, which a parent's thread may have held at the fork) can
//! hang. So the runtime, the stores, and the lock and elector of each Python
//! object are kept in a [`PerProcess`]: a child never uses nor drops the
//! parent's, and makes its own on first use.

/// A value, and the process that made it.
#[derive(Debug)]
pub(crate) struct PerProcess<T> {
    pid: u32,
    /// Always `Some`, but taken by the drop in another process.
    value: Option<T>,
}

impl<T> PerProcess<T> {
    /// `value`, made in this process.
    pub(crate) fn new(value: T) -> Self {
        PerProcess { pid: std::process::id(), value: Some(value) }
    }

    /// The value, in the process that made it; `None` in a child forked later.
    pub(crate) fn get(&self) -> Option<&T> {
        (self.pid == std::process::id()).then_some(self.value.as_ref()).flatten()
    }

    /// The value, in the process that made it; `None` in a child forked later.
    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        (self.pid == std::process::id()).then_some(self.value.as_mut()).flatten()
    }

    /// The value of this process: in a child forked after it was made, a new
    /// one from `make` (the parent's is left alone, see the module docs).
    pub(crate) fn get_or_insert_with(&mut self, make: impl FnOnce() -> T) -> &mut T {
        if self.pid != std::process::id() {
            // The old one's drop leaks the parent's value.
            *self = PerProcess { pid: std::process::id(), value: None };
        }
        self.value.get_or_insert_with(make)
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // The parent's: never dropped here.
            std::mem::forget(self.value.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PerProcess;

    #[test]
    fn the_maker_process_sees_its_value() {
        let mut p = PerProcess::new(7);
        assert_eq!(p.get(), Some(&7));
        assert_eq!(*p.get_or_insert_with(|| 8), 7);
    }
}
