//! PyO3 glue only: `ipsec_lab._native`. Logic lives in the `ipsec` and `ipsec-bench` crates.
#![deny(unsafe_code)] // PyO3's macros allow their own; nothing here writes any

mod bench;
mod bundle;
mod facts;
mod ipcomp;
mod sa;

use ipsec::crypto::SecretBytes;
use ipsec::DropReason;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

pyo3::create_exception!(
    _native,
    DropError,
    PyException,
    "A packet was refused; args[0] is the drop reason (e.g. 'icv_failure')."
);

pub(crate) fn drop_err(d: DropReason) -> PyErr {
    DropError::new_err((
        d.label(),
        format!("packet dropped: {} ({})", d.label(), d.class().label()),
    ))
}

pub(crate) fn key_arg(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<SecretBytes> {
    let Some(v) = v else {
        return Ok(SecretBytes::default());
    };
    if let Ok(s) = v.downcast::<PyString>() {
        return SecretBytes::from_hex(&s.to_cow()?)
            .map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
    }
    if let Ok(b) = v.extract::<Vec<u8>>() {
        return Ok(SecretBytes::new(b));
    }
    Err(PyValueError::new_err(format!(
        "{name}: expected bytes or a hex string"
    )))
}

/// The clock lent for per-stage timing when `on`.
pub(crate) fn lent_clock(on: bool) -> Option<ipsec::Clock> {
    on.then_some(ipsec_bench::mono_ns as ipsec::Clock)
}

/// A counters dict's `drops` (non-zero reasons) and `stages` entries.
pub(crate) fn set_drops_and_stages(
    d: &Bound<'_, PyDict>,
    drops: &ipsec::DropCounters,
    stages: &ipsec::StageTimes,
) -> PyResult<()> {
    let dd = PyDict::new(d.py());
    for (k, v) in drops.nonzero() {
        dd.set_item(k, v)?;
    }
    d.set_item("drops", dd)?;
    d.set_item("stages", stage_dict(d.py(), stages)?)
}

/// `{stage: {"ns": total, "calls": n}}` for the stages that ran.
pub(crate) fn stage_dict<'py>(
    py: Python<'py>,
    st: &ipsec::StageTimes,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (label, ns, calls) in st.nonzero() {
        let e = PyDict::new(py);
        e.set_item("ns", ns)?;
        e.set_item("calls", calls)?;
        d.set_item(label, e)?;
    }
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<sa::PySa>()?;
    m.add_class::<ipcomp::PyIpcomp>()?;
    m.add_class::<bundle::PyBundle>()?;
    m.add("DropError", m.py().get_type::<DropError>())?;
    m.add_function(wrap_pyfunction!(bench::run_bench, m)?)?;
    m.add_function(wrap_pyfunction!(bench::run_bench_configs, m)?)?;
    m.add_function(wrap_pyfunction!(bench::default_suites, m)?)?;
    m.add_function(wrap_pyfunction!(bench::stage_off_cost_ns, m)?)?;
    m.add_function(wrap_pyfunction!(facts::algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(facts::stages, m)?)?;
    m.add_function(wrap_pyfunction!(facts::drop_reasons, m)?)?;
    m.add("DEFAULT_SIZES", ipsec_bench::DEFAULT_SIZES.to_vec())?;
    Ok(())
}
