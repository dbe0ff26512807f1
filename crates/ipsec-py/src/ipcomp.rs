//! `IpcompAssociation`: an IPComp SA (RFC 3173) of the engine.

use ipsec::{Compressed, IpcompConfig, IpcompSa, PacketBuf};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::*;

/// An IPComp association (RFC 3173 §3: IPCA): DEFLATE per packet, no keys.
#[pyclass(name = "IpcompAssociation", module = "ipsec_lab._native")]
pub(crate) struct PyIpcomp {
    pub(crate) sa: IpcompSa,
}

#[pymethods]
impl PyIpcomp {
    #[new]
    #[pyo3(signature = (cpi, *, min_size=ipsec::ipcomp::DEFAULT_MIN_SIZE,
        window_bits=ipsec::ipcomp::DEFAULT_WINDOW_BITS, level=ipsec::ipcomp::DEFAULT_LEVEL))]
    fn new(cpi: u16, min_size: usize, window_bits: u8, level: i32) -> PyResult<Self> {
        let cfg = IpcompConfig {
            cpi,
            min_size,
            window_bits,
            level,
        };
        Ok(PyIpcomp {
            sa: IpcompSa::new(cfg).map_err(|e| PyValueError::new_err(e.to_string()))?,
        })
    }

    /// Compress a payload whose protocol is `next_header`: the IPComp header and DEFLATE
    /// data, or None when it is sent as it was (too small, or not smaller).
    fn compress<'py>(
        &mut self,
        py: Python<'py>,
        payload: &[u8],
        next_header: u8,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut buf = payload.to_vec();
        match self
            .sa
            .compress_payload(&mut buf, 0, payload.len(), next_header)
            .map_err(drop_err)?
        {
            Compressed::Yes(n) => Ok(Some(PyBytes::new(py, &buf[..n]))),
            _ => Ok(None),
        }
    }

    /// Decompress an IPComp header + DEFLATE data; returns (payload, next_header).
    fn decompress<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<(Bound<'py, PyBytes>, u8)> {
        let mut buf = vec![0u8; ipsec::constants::MAX_PACKET.max(data.len())];
        buf[..data.len()].copy_from_slice(data);
        let (n, nh) = self
            .sa
            .decompress_payload(&mut buf, 0, data.len())
            .map_err(drop_err)?;
        Ok((PyBytes::new(py, &buf[..n]), nh))
    }

    /// Transport mode: compress an IP packet's payload (or return the packet as it was).
    fn seal<'py>(&mut self, py: Python<'py>, packet: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; packet.len()];
        buf.copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, 0, packet.len()).map_err(drop_err)?;
        self.sa.seal(&mut p).map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }

    /// Transport mode: decompress an IP packet whose payload is IPComp.
    fn open<'py>(&mut self, py: Python<'py>, packet: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; ipsec::constants::MAX_PACKET.max(packet.len())];
        buf[..packet.len()].copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, 0, packet.len()).map_err(drop_err)?;
        self.sa.open(&mut p).map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }

    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let c = &self.sa.counters;
        d.set_item("compressed", c.compressed)?;
        d.set_item("incompressible", c.incompressible)?;
        d.set_item("too_small", c.too_small)?;
        d.set_item("bytes_in", c.bytes_in)?;
        d.set_item("bytes_out", c.bytes_out)?;
        d.set_item("decompressed", c.decompressed)?;
        set_drops_and_stages(&d, &c.drops, &self.sa.stages)?;
        Ok(d)
    }

    /// Switch per-stage timing on or off; `counters()["stages"]` then holds ns and calls.
    fn set_stage_timing(&mut self, on: bool) {
        self.sa.stages.set_clock(lent_clock(on));
    }

    #[getter]
    fn cpi(&self) -> u16 {
        self.sa.config().cpi
    }

    fn __repr__(&self) -> String {
        let c = self.sa.config();
        format!(
            "IpcompAssociation(cpi={}, min_size={}, window_bits={}, level={})",
            c.cpi, c.min_size, c.window_bits, c.level
        )
    }
}
