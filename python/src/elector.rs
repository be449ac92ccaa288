//! `NativeElector`: a `mongoelector::Elector`, for the Python `MongoElector`
//! and `MongoLeaderElector`.

use std::time::Duration;

use mongoelector::{Elector, Role};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use store_mongo::MongoStore;

use crate::errors::elector_error;
use crate::lock::holder_dict;
use crate::runtime::{enter, store, wait};

/// One participant in one election.
#[pyclass(module = "mongoelector._native", frozen)]
#[derive(Debug)]
pub(crate) struct NativeElector {
    elector: Elector<MongoStore>,
}

/// A Python callable as an elector callback. It runs on one of the runtime's
/// blocking threads (never on the renewal path) and holds the GIL only while
/// it runs; the Python side wraps user callbacks so that they log their
/// exceptions, and anything still raised is printed here.
fn callback(f: Py<PyAny>) -> impl Fn() + Send + Sync + 'static {
    move || {
        Python::attach(|py| {
            if let Err(e) = f.call0(py) {
                e.print(py);
            }
        })
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
        let store = store(py, uri, database)?;
        let ttl = Duration::try_from_secs_f64(ttl)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("ttl: {e}")))?;
        let mut b = Elector::builder(store, key).ttl(ttl).report_status(report_status);
        if let Some(f) = on_leader {
            b = b.on_leader(callback(f));
        }
        if let Some(f) = on_leader_loss {
            b = b.on_leader_loss(callback(f));
        }
        if let Some(f) = on_loop {
            b = b.on_loop(callback(f));
        }
        if let Some(v) = version {
            b = b.version(v);
        }
        // Building spawns nothing, but may look for the runtime.
        let elector = enter(|| b.build())?.map_err(elector_error)?;
        Ok(NativeElector { elector })
    }

    /// This node's instance id (the `uuid` of the seed).
    #[getter]
    fn instance(&self) -> String {
        self.elector.identity().instance().to_owned()
    }

    /// Starts the background loop and returns.
    fn start(&self) -> PyResult<()> {
        enter(|| self.elector.start())?.map_err(elector_error)
    }

    /// Starts and returns only after `stop()` (from another thread).
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector.clone();
        wait(py, async move { elector.run().await })?.map_err(elector_error)
    }

    /// Stops the loop and surrenders leadership; returns once the lease is
    /// released and `on_leader_loss` ran, or after the stop timeout (the ttl).
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector.clone();
        wait(py, async move { elector.stop().await })
    }

    /// One round by hand: renew or campaign once, `on_loop`, report. Whether
    /// this node leads afterwards.
    fn poll(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector.clone();
        let role = wait(py, async move { elector.poll().await })?.map_err(elector_error)?;
        Ok(role == Role::Leader)
    }

    /// Releases leadership if held (calling `on_leader_loss`); whether it was.
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector.clone();
        wait(py, async move { elector.release().await })?.map_err(elector_error)
    }

    /// Whether this node leads (no round trip).
    fn is_leader(&self) -> bool {
        self.elector.is_leader()
    }

    /// Whether any node leads now (store clock).
    fn leader_exists(&self, py: Python<'_>) -> PyResult<bool> {
        let elector = self.elector.clone();
        wait(py, async move { elector.leader_exists().await })?.map_err(elector_error)
    }

    /// Whether the background loop runs.
    fn running(&self) -> bool {
        self.elector.running()
    }

    /// Upserts this node's status document now.
    fn report_status(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector.clone();
        wait(py, async move { elector.report_status().await })?.map_err(elector_error)
    }

    /// This node's status as a dict (times in epoch ms, store clock).
    fn node_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.elector.node_status();
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
        d.set_item("last_poll_ms", s.last_poll.map(|t| t.as_millis()))?;
        Ok(d)
    }

    /// The nodes that reported within three ttls, and the leader, as a dict.
    fn cluster_detail<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let elector = self.elector.clone();
        let c = wait(py, async move { elector.cluster_detail().await })?.map_err(elector_error)?;
        let nodes = PyList::empty(py);
        for n in &c.nodes {
            let d = PyDict::new(py);
            d.set_item("key", &n.election)?;
            d.set_item("node", &n.node)?;
            d.set_item("host", &n.host)?;
            d.set_item("pid", n.pid)?;
            d.set_item("version", &n.version)?;
            d.set_item("is_leader", n.is_leader)?;
            d.set_item("last_poll_ms", n.last_poll.as_millis())?;
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
