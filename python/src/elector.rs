//! `NativeElector`: a `mongoelector::Elector`, for the Python `MongoElector`
//! and `MongoLeaderElector`.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use mongoelector::{Elector, Role};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use store_mongo::MongoStore;

use crate::callbacks::callback;
use crate::errors::elector_error;
use crate::lock::holder_dict;
use crate::process::PerProcess;
use crate::runtime::{enter, store, wait, wait_interruptible};

/// One participant in one election.
///
/// In a child forked after it was made, it is a new elector of the same
/// election, stopped, with an identity of its own: what ran in the parent
/// (its loop, its term) stays the parent's.
#[pyclass(module = "mongoelector._native", frozen)]
#[derive(Debug)]
pub(crate) struct NativeElector {
    config: ElectorConfig,
    state: Mutex<PerProcess<Elector<MongoStore>>>,
}

/// What the elector is made from (again, in a forked child). The callbacks
/// are the Python side's `start(done)` callables (see `callbacks.rs`).
#[derive(Debug)]
struct ElectorConfig {
    uri: String,
    database: String,
    key: String,
    ttl: Duration,
    on_leader: Option<Py<PyAny>>,
    on_leader_loss: Option<Py<PyAny>>,
    on_loop: Option<Py<PyAny>>,
    report_status: bool,
    version: Option<String>,
}

impl ElectorConfig {
    fn build(&self, py: Python<'_>) -> PyResult<Elector<MongoStore>> {
        let store = store(py, &self.uri, &self.database)?;
        let mut b = Elector::builder(store, &self.key).ttl(self.ttl).report_status(self.report_status);
        if let Some(f) = &self.on_leader {
            b = b.on_leader(callback(f.clone_ref(py)));
        }
        if let Some(f) = &self.on_leader_loss {
            b = b.on_leader_loss(callback(f.clone_ref(py)));
        }
        if let Some(f) = &self.on_loop {
            b = b.on_loop(callback(f.clone_ref(py)));
        }
        if let Some(v) = &self.version {
            b = b.version(v);
        }
        // Building spawns nothing, but may look for the runtime.
        enter(|| b.build())?.map_err(elector_error)
    }
}

impl NativeElector {
    /// This process's elector (made anew in a forked child).
    fn elector(&self, py: Python<'_>) -> PyResult<Elector<MongoStore>> {
        if let Some(e) = self.state.lock().get() {
            return Ok(e.clone());
        }
        // Connecting waits with the GIL released: not under the mutex.
        let elector = self.config.build(py)?;
        Ok(self.state.lock().get_or_insert_with(|| elector).clone())
    }
}

#[pymethods]
impl NativeElector {
    /// Connects (once per process for a given `uri` and `database`) and
    /// configures the elector.
    #[new]
    #[pyo3(signature = (uri, database, key, ttl, on_leader, on_leader_loss, on_loop, report_status, version))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        uri: &str,
        database: &str,
        key: &str,
        ttl: f64,
        on_leader: Option<Py<PyAny>>,
        on_leader_loss: Option<Py<PyAny>>,
        on_loop: Option<Py<PyAny>>,
        report_status: bool,
        version: Option<String>,
    ) -> PyResult<Self> {
        let ttl = Duration::try_from_secs_f64(ttl)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("ttl: {e}")))?;
        let config = ElectorConfig {
            uri: uri.to_owned(),
            database: database.to_owned(),
            key: key.to_owned(),
            ttl,
            on_leader,
            on_leader_loss,
            on_loop,
            report_status,
            version,
        };
        let elector = config.build(py)?;
        Ok(NativeElector { config, state: Mutex::new(PerProcess::new(elector)) })
    }

    /// This node's instance id (the `uuid` of the seed).
    #[getter]
    fn instance(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.elector(py)?.identity().instance().to_owned())
    }

    /// Starts the background loop and returns.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector(py)?;
        enter(|| elector.start())?.map_err(elector_error)
    }

    /// Starts and returns only after `stop()` (from another thread). Ctrl-C
    /// interrupts the wait (the elector runs on, as upstream's thread does).
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector(py)?;
        wait_interruptible(py, async move { elector.run().await })?.map_err(elector_error)
    }

    /// Stops the loop and surrenders leadership. With `and_wait`, returns once the
    /// lease is released and `on_leader_loss` ran, or after the stop timeout
    /// (the ttl). Without (from one of this elector's own callbacks, which the
    /// stop would wait for), returns once the elector is marked stopped and its
    /// loop told to end; the release and `on_leader_loss` follow.
    fn stop(&self, py: Python<'_>, and_wait: bool) -> PyResult<()> {
        // Made in the parent: nothing of it runs in this process.
        let Some(elector) = self.state.lock().get().cloned() else { return Ok(()) };
        let mut stop = Box::pin(async move { elector.stop().await });
        // The first poll marks the elector stopped and cancels its loop; the
        // rest (the release, `on_leader_loss`) runs on a task of its own, so
        // Ctrl-C while waiting for it (an interruptible wait, see `runtime`)
        // only stops the waiting: the elector is stopped all the same.
        let rest = wait(py, async move {
            let done = std::future::poll_fn(|cx| Poll::Ready(stop.as_mut().poll(cx).is_ready())).await;
            (!done).then(|| tokio::spawn(stop))
        })?;
        if let Some(rest) = rest.filter(|_| and_wait) {
            // A stop that panicked is logged by the runtime; nothing to raise.
            let _ = wait(py, rest)?;
        }
        Ok(())
    }

    /// One round by hand: renew or campaign once, `on_loop`, report. Whether
    /// this node leads afterwards.
    fn poll(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector(py)?;
        let role = wait(py, async move { elector.poll().await })?.map_err(elector_error)?;
        Ok(role == Role::Leader)
    }

    /// Releases leadership if held (calling `on_leader_loss`); whether it was.
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector(py)?;
        wait(py, async move { elector.release().await })?.map_err(elector_error)
    }

    /// Whether this node leads (no round trip).
    fn is_leader(&self) -> bool {
        self.state.lock().get().is_some_and(Elector::is_leader)
    }

    /// Whether any node leads now (store clock).
    fn leader_exists(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector(py)?;
        wait(py, async move { elector.leader_exists().await })?.map_err(elector_error)
    }

    /// Whether the background loop runs.
    fn running(&self) -> bool {
        self.state.lock().get().is_some_and(Elector::running)
    }

    /// Upserts this node's status document now.
    fn report_status(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector(py)?;
        wait(py, async move { elector.report_status().await })?.map_err(elector_error)
    }

    /// This node's status as a dict (times in epoch ms, store clock).
    fn node_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.elector(py)?.node_status();
        let d = PyDict::new(py);
        d.set_item("key", s.key)?;
        d.set_item("node", s.node)?;
        d.set_item("host", s.host)?;
        d.set_item("pid", s.pid)?;
        d.set_item("version", s.version)?;
        d.set_item("running", s.running)?;
        d.set_item("is_leader", s.is_leader)?;
        d.set_item("fence", s.fence)?;
        d.set_item("leader", s.leader.as_ref().map(|h| holder_dict(py, h)).transpose()?)?;
        d.set_item("terms_won", s.terms_won)?;
        d.set_item("last_round_ms", s.last_round.map(|t| t.as_millis()))?;
        Ok(d)
    }

    /// The nodes that reported within three ttls, and the leader, as a dict.
    fn cluster_detail<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let elector = self.elector(py)?;
        let c = wait(py, async move { elector.cluster_detail().await })?.map_err(elector_error)?;
        let nodes = PyList::empty(py);
        for n in &c.nodes {
            let d = PyDict::new(py);
            d.set_item("key", &n.key)?;
            d.set_item("node", &n.node)?;
            d.set_item("host", &n.host)?;
            d.set_item("pid", n.pid)?;
            d.set_item("version", &n.version)?;
            d.set_item("is_leader", n.is_leader)?;
            d.set_item("last_round_ms", n.last_round.as_millis())?;
            nodes.append(d)?;
        }
        let d = PyDict::new(py);
        d.set_item("key", c.key)?;
        d.set_item("now_ms", c.now.as_millis())?;
        d.set_item("leader", c.leader.as_ref().map(|h| holder_dict(py, h)).transpose()?)?;
        d.set_item("nodes", nodes)?;
        Ok(d)
    }
}
