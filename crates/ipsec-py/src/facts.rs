//! The engine's facts for the lab: its algorithm table, its stages, its drop reasons.

use ipsec::DropReason;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Every algorithm's row of the engine's table (`crates/ipsec/src/crypto/table.rs`):
/// `{"encryption": [row, ...], "integrity": [row, ...]}`, each row a dict of its facts.
#[pyfunction]
pub(crate) fn algorithms(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    let enc = PyList::empty(py);
    for r in ipsec::crypto::table::ENCRYPTIONS {
        let d = PyDict::new(py);
        d.set_item("name", r.name)?;
        d.set_item("title", r.title)?;
        d.set_item("rfc", r.rfc)?;
        d.set_item("kind", r.kind().label())?;
        d.set_item("key_len", r.key_len)?;
        d.set_item("salt_len", r.salt_len)?;
        d.set_item("iv_len", r.iv_len)?;
        d.set_item("icv_len", r.icv_len)?;
        d.set_item("block_len", r.block_len)?;
        d.set_item("align", r.align())?;
        d.set_item("work_block", r.work_block)?;
        d.set_item("legacy", r.legacy)?;
        d.set_item("kernel", r.kernel)?;
        d.set_item("libipsec", r.libipsec)?;
        enc.append(d)?;
    }
    let integ = PyList::empty(py);
    for r in ipsec::crypto::table::INTEGRITIES {
        let d = PyDict::new(py);
        d.set_item("name", r.name)?;
        d.set_item("title", r.title)?;
        d.set_item("rfc", r.rfc)?;
        d.set_item("key_len", r.key_len)?;
        d.set_item("salt_len", r.salt_len)?;
        d.set_item("iv_len", r.iv_len)?;
        d.set_item("icv_len", r.icv_len)?;
        d.set_item("work_block", r.work_block)?;
        d.set_item("md_pad", r.md_pad)?;
        d.set_item("esp", r.esp)?;
        d.set_item("ah", r.ah)?;
        d.set_item("legacy", r.legacy)?;
        d.set_item("kernel", r.kernel)?;
        integ.append(d)?;
    }
    out.set_item("encryption", enc)?;
    out.set_item("integrity", integ)?;
    Ok(out)
}

/// The engine's stages in order, each `(label, per_byte)`: per-byte stages are the
/// model's L_alg / R_alg, the rest its t_fix (`crates/ipsec/src/stage.rs`).
#[pyfunction]
pub(crate) fn stages() -> Vec<(&'static str, bool)> {
    ipsec::Stage::ALL
        .iter()
        .map(|s| (s.label(), s.per_byte()))
        .collect()
}

/// Every drop reason label, in counter order.
#[pyfunction]
pub(crate) fn drop_reasons() -> Vec<&'static str> {
    DropReason::ALL.iter().map(|d| d.label()).collect()
}
