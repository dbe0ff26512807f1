//! `bench`, `bench_configs` and their companions: arguments checked and results turned
//! into dicts; the measuring is `ipsec-bench`'s.

use std::time::Duration;

use ipsec::{Mode, Suite};
use ipsec_bench::{BenchConfig, Op};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Run the engine benchmark (timing loop in Rust, one thread). Returns a list of dicts
/// with suite, mode, op, size, ns_per_packet, raw_ns_per_packet, l_alg.
#[pyfunction(name = "bench")]
#[pyo3(signature = (suites=None, sizes=None, modes=None, ops=None, budget_ms=100, trials=5, progress=None, stages=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_bench<'py>(
    py: Python<'py>,
    suites: Option<Vec<String>>,
    sizes: Option<Vec<usize>>,
    modes: Option<Vec<String>>,
    ops: Option<Vec<String>>,
    budget_ms: u64,
    trials: usize,
    progress: Option<PyObject>,
    stages: bool,
) -> PyResult<Bound<'py, PyList>> {
    let mut cfg = BenchConfig::default();
    if let Some(s) = suites {
        cfg.suites = s
            .iter()
            .map(|p| {
                Suite::parse(p).map_err(|e| PyValueError::new_err(format!("suite {p:?}: {e}")))
            })
            .collect::<PyResult<_>>()?;
    }
    if let Some(s) = sizes {
        check_sizes(&s)?;
        cfg.sizes = s;
    }
    if let Some(m) = modes {
        cfg.modes = m
            .iter()
            .map(|x| {
                Mode::from_name(x).ok_or_else(|| {
                    PyValueError::new_err(format!("mode {x:?}: use tunnel or transport"))
                })
            })
            .collect::<PyResult<_>>()?;
    }
    if let Some(o) = ops {
        cfg.ops = parse_ops(&o)?;
    }
    check_budget(budget_ms, trials)?;
    cfg.budget = Duration::from_millis(budget_ms);
    cfg.trials = trials;
    cfg.stage_timing = stages;
    let results = py.allow_threads(|| {
        ipsec_bench::run(&cfg, |done, total| {
            if let Some(cb) = &progress {
                Python::with_gil(|py| {
                    let _ = cb.call1(py, (done, total));
                });
            }
        })
    });
    let out = PyList::empty(py);
    for r in results {
        let d = PyDict::new(py);
        d.set_item("suite", r.suite)?;
        d.set_item("mode", r.mode.name())?;
        d.set_item("op", r.op.name())?;
        d.set_item("size", r.size)?;
        d.set_item("ns_per_packet", r.ns_per_packet)?;
        d.set_item("raw_ns_per_packet", r.raw_ns_per_packet)?;
        d.set_item("l_alg", r.l_alg)?;
        if stages {
            set_stage_split(&d, &r.stages, r.stage_points)?;
        }
        out.append(d)?;
    }
    Ok(out)
}

/// Benchmark whole configurations (an ESP or AH SA, or a bundle) on text or random
/// payloads. Returns dicts with config, payload, op, size, ns_per_packet, wire_len (and
/// stages, stage_points with `stages`).
#[pyfunction(name = "bench_configs")]
#[pyo3(signature = (configs, sizes, ops, payloads, budget_ms=100, trials=5, stages=false, progress=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_bench_configs<'py>(
    py: Python<'py>,
    configs: Vec<String>,
    sizes: Vec<usize>,
    ops: Vec<String>,
    payloads: Vec<String>,
    budget_ms: u64,
    trials: usize,
    stages: bool,
    progress: Option<PyObject>,
) -> PyResult<Bound<'py, PyList>> {
    use ipsec_bench::configs::{run_configs, ConfigSpec, Payload};
    let specs = configs
        .iter()
        .map(|c| ConfigSpec::parse(c).map_err(PyValueError::new_err))
        .collect::<PyResult<Vec<_>>>()?;
    check_sizes(&sizes)?;
    let ops = parse_ops(&ops)?;
    let payloads = payloads
        .iter()
        .map(|x| Payload::from_name(x).map_err(PyValueError::new_err))
        .collect::<PyResult<Vec<_>>>()?;
    check_budget(budget_ms, trials)?;
    let budget = Duration::from_millis(budget_ms);
    let results = py.allow_threads(|| {
        run_configs(
            &specs,
            &payloads,
            &sizes,
            &ops,
            budget,
            trials,
            stages,
            |done, total| {
                if let Some(cb) = &progress {
                    Python::with_gil(|py| {
                        let _ = cb.call1(py, (done, total));
                    });
                }
            },
        )
    });
    let list = PyList::empty(py);
    for r in results {
        let d = PyDict::new(py);
        d.set_item("config", r.config)?;
        d.set_item("payload", r.payload.name())?;
        d.set_item("op", r.op.name())?;
        d.set_item("size", r.size)?;
        d.set_item("ns_per_packet", r.ns_per_packet)?;
        d.set_item("wire_len", r.wire_len)?;
        if stages {
            set_stage_split(&d, &r.stages, r.stage_points)?;
        }
        list.append(d)?;
    }
    Ok(list)
}

/// A benchmark row's per-stage split: `stages` {label: ns per packet}, `stage_points`.
pub(crate) fn set_stage_split(
    d: &Bound<'_, PyDict>,
    split: &[(&'static str, f64)],
    points: f64,
) -> PyResult<()> {
    let st = PyDict::new(d.py());
    for (label, ns) in split {
        st.set_item(*label, *ns)?;
    }
    d.set_item("stages", st)?;
    d.set_item("stage_points", points)
}

pub(crate) fn check_sizes(sizes: &[usize]) -> PyResult<()> {
    sizes
        .iter()
        .try_for_each(|&s| ipsec_bench::check_size(s))
        .map_err(PyValueError::new_err)
}

pub(crate) fn parse_ops(ops: &[String]) -> PyResult<Vec<Op>> {
    ops.iter()
        .map(|x| Op::from_name(x).map_err(PyValueError::new_err))
        .collect()
}

pub(crate) fn check_budget(budget_ms: u64, trials: usize) -> PyResult<()> {
    if budget_ms == 0 || trials == 0 {
        return Err(PyValueError::new_err(
            "budget_ms and trials must be at least 1",
        ));
    }
    Ok(())
}

/// ns one timing point costs when per-stage timing is off (median of `trials`).
#[pyfunction]
#[pyo3(signature = (trials=5))]
pub(crate) fn stage_off_cost_ns(py: Python<'_>, trials: usize) -> f64 {
    py.allow_threads(|| ipsec_bench::stage_off_cost_ns(trials))
}

/// The suites `bench` runs by default.
#[pyfunction]
pub(crate) fn default_suites() -> Vec<String> {
    Suite::bench_defaults().iter().map(Suite::name).collect()
}
