//! The test subscribers of traces: each test's own, scoped to its thread,
//! under one global subscriber that keeps `tracing`'s interest per call.

/// A global subscriber that records nothing and finds every callsite
/// "sometimes" of interest. `tracing` caches a callsite's interest over
/// every subscriber alive: one registered while only a concurrent test's
/// filter (or no subscriber) was there is cached as "never", and a test's
/// own subscriber would miss its spans (one test in about 17 did). With
/// this one alive, each call asks the current subscriber.
struct Sometimes;

impl tracing::Subscriber for Sometimes {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// `subscriber`, this thread's until the guard drops, with [`Sometimes`]
/// the global one: what every test of traces here sets its subscriber with.
pub(crate) fn scoped(
    subscriber: impl tracing::Subscriber + Send + Sync + 'static,
) -> tracing::subscriber::DefaultGuard {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| tracing::subscriber::set_global_default(Sometimes).expect("no other global subscriber"));
    tracing::subscriber::set_default(subscriber)
}
