//! How big a `lab bench` run is: its [`Mode`], the sizes of each section in
//! that mode ([`Size`]), and what to run ([`BenchOpts`]).

use std::path::PathBuf;

use super::agenda::AgendaSize;
use crate::server::ServerSpec;

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every section at a tiny size, then a check that every promised figure
    /// is there (CI runs it: the bench cannot rot unseen). Its numbers mean
    /// nothing.
    Smoke,
    /// A short run whose figures compare within the run.
    Quick,
    /// The README's figures.
    Full,
}

/// The sizes of each section in one [`Mode`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Size {
    /// Raw `findAndModify` calls, lock cycles (ours and the seed's),
    /// minimal-pipeline cycles.
    pub(super) calls: usize,
    pub(super) handovers: usize,
    /// Clean stops, then as many kills, of the elected leader.
    pub(super) elect_trials: usize,
    /// Tasks per queue shape.
    pub(super) tasks: u32,
    pub(super) picks: usize,
    pub(super) ticks: usize,
    pub(super) sim_minutes: u64,
    /// Seconds each idle process is measured, after `idle_warm_up_s`: long
    /// enough to take in the periodic costs (a change stream's `getMore`
    /// every 2 minutes, an idle agent's check every 10) at full size.
    pub(super) idle_s: u64,
    /// Seconds before the idle window opens: past an agent's quiet spell
    /// (`mongoagent/src/control.rs`, 30 s), so the window sees it idle.
    pub(super) idle_warm_up_s: u64,
    pub(super) agenda: AgendaSize,
}

impl Mode {
    pub(super) fn size(self) -> Size {
        match self {
            Mode::Smoke => Size {
                calls: 20,
                handovers: 2,
                elect_trials: 1,
                tasks: 20,
                picks: 2,
                ticks: 2,
                sim_minutes: 1,
                idle_s: 2,
                idle_warm_up_s: 3,
                // As many jobs as our tasks, so the ratios compare like with like.
                agenda: AgendaSize { jobs: 20, picks: 1, limit_s: 30 },
            },
            Mode::Quick => Size {
                calls: 300,
                handovers: 10,
                elect_trials: 3,
                tasks: 400,
                picks: 10,
                ticks: 10,
                sim_minutes: 10,
                idle_s: 130,
                idle_warm_up_s: 35,
                agenda: AgendaSize { jobs: 400, picks: 5, limit_s: 120 },
            },
            Mode::Full => Size {
                calls: 2000,
                handovers: 30,
                elect_trials: 5,
                tasks: 2000,
                picks: 30,
                ticks: 30,
                sim_minutes: 60,
                idle_s: 600,
                idle_warm_up_s: 35,
                agenda: AgendaSize { jobs: 2000, picks: 15, limit_s: 180 },
            },
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Smoke => "smoke",
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct BenchOpts {
    pub(crate) mode: Mode,
    pub(crate) out: PathBuf,
    pub(crate) mongocoord: PathBuf,
    pub(crate) python: Option<PathBuf>,
    pub(crate) seed_script: Option<PathBuf>,
    /// The installed Agenda harness (a directory with `bench.mjs` and its
    /// `node_modules`); without it the Agenda figures are skipped.
    pub(crate) agenda: Option<PathBuf>,
    /// The server each of Agenda's settings gets fresh; `None`: the run's.
    pub(crate) peer_server: Option<ServerSpec>,
    /// Tasks per queue run (ours, the raw loop's and Agenda's alike), in
    /// place of the mode's.
    pub(crate) tasks: Option<u32>,
}

impl BenchOpts {
    /// The mode's sizes, with the queue's task count overridden if asked.
    pub(super) fn size(&self) -> Size {
        let mut size = self.mode.size();
        if let Some(n) = self.tasks {
            size.tasks = n;
            size.agenda.jobs = n;
        }
        size
    }
}
