//! `SecurityBundle`: IPComp → ESP → AH applied as one (RFC 4301 §4.5).

use ipsec::crypto::state::IvSource;
use ipsec::{PacketBuf, HEADROOM, TAILROOM};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::ipcomp::PyIpcomp;
use crate::sa::PySa;
use crate::*;

/// An SA bundle (RFC 4301 §4.5): IPComp → ESP (tunnel) → AH outbound, reverse inbound.
/// It borrows its associations for each packet; their counters stay theirs.
#[pyclass(name = "SecurityBundle", module = "ipsec_lab._native")]
pub(crate) struct PyBundle {
    esp: Py<PySa>,
    ah: Option<Py<PySa>>,
    ipcomp: Option<Py<PyIpcomp>>,
}

impl PyBundle {
    fn with_layers<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut ipsec::bundle::Layers<'_>) -> R,
    ) -> PyResult<R> {
        let mut esp = self.esp.try_borrow_mut(py)?;
        let mut ah = match &self.ah {
            Some(a) => Some(a.try_borrow_mut(py)?),
            None => None,
        };
        let mut ipcomp = match &self.ipcomp {
            Some(c) => Some(c.try_borrow_mut(py)?),
            None => None,
        };
        let mut layers = ipsec::bundle::Layers {
            ipcomp: ipcomp.as_mut().map(|c| &mut c.sa),
            esp: &mut esp.sa,
            ah: ah.as_mut().map(|a| &mut a.sa),
        };
        Ok(f(&mut layers))
    }
}

#[pymethods]
impl PyBundle {
    #[new]
    #[pyo3(signature = (esp, *, ah=None, ipcomp=None))]
    fn new(
        py: Python<'_>,
        esp: Py<PySa>,
        ah: Option<Py<PySa>>,
        ipcomp: Option<Py<PyIpcomp>>,
    ) -> PyResult<Self> {
        {
            let e = esp.borrow(py);
            let a = ah.as_ref().map(|a| a.borrow(py));
            ipsec::bundle::check(&e.sa, a.as_ref().map(|a| &a.sa))
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        Ok(PyBundle { esp, ah, ipcomp })
    }

    /// Seal an inner IP packet through every layer. `iv` and `seq` fix ESP's IV and
    /// sequence number, for known-answer tests only.
    #[pyo3(signature = (packet, *, iv=None, seq=None))]
    fn seal<'py>(
        &self,
        py: Python<'py>,
        packet: &[u8],
        iv: Option<Vec<u8>>,
        seq: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; HEADROOM + packet.len() + TAILROOM];
        buf[HEADROOM..HEADROOM + packet.len()].copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, HEADROOM, packet.len()).map_err(drop_err)?;
        let ivs = iv.as_deref().map_or(IvSource::Generate, IvSource::Fixed);
        self.with_layers(py, |l| {
            if let Some(s) = seq {
                l.esp.set_next_seq(s)?;
            }
            l.seal(&mut p, ivs)
        })?
        .map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }

    /// Open a packet that came through this bundle; returns the inner IP packet.
    fn open<'py>(&self, py: Python<'py>, packet: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; HEADROOM + ipsec::constants::MAX_PACKET.max(packet.len())];
        buf[HEADROOM..HEADROOM + packet.len()].copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, HEADROOM, packet.len()).map_err(drop_err)?;
        self.with_layers(py, |l| l.open(&mut p))?
            .map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }
}
