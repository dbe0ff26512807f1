//! `SecurityAssociation`: one ESP or AH SA of the engine, sealing and opening packets.

use ipsec::crypto::state::IvSource;
use ipsec::{Mode, PacketBuf, Protocol, Sa, SaConfig, Suite, TunnelEndpoints, HEADROOM, TAILROOM};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::*;

/// One IPsec security association (ESP). Keys are never shown by repr().
#[pyclass(name = "SecurityAssociation", module = "ipsec_lab._native")]
pub(crate) struct PySa {
    pub(crate) sa: Sa,
}

impl PySa {
    fn esp_only(&self, what: &str) -> PyResult<()> {
        if self.sa.protocol() != Protocol::Esp {
            return Err(PyValueError::new_err(format!(
                "{what}: this is an AH SA; use seal/open on whole IP packets"
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl PySa {
    #[new]
    #[pyo3(signature = (spi, encryption, integrity="null", *, enc_key=None, integ_key=None,
        mode="tunnel", tunnel_src=None, tunnel_dst=None, esn=false, replay_window=Some(1024),
        legacy=false, protocol="esp"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        spi: u32,
        encryption: &str,
        integrity: &str,
        enc_key: Option<&Bound<'_, PyAny>>,
        integ_key: Option<&Bound<'_, PyAny>>,
        mode: &str,
        tunnel_src: Option<&str>,
        tunnel_dst: Option<&str>,
        esn: bool,
        replay_window: Option<u32>,
        legacy: bool,
        protocol: &str,
    ) -> PyResult<Self> {
        let suite = Suite::from_names(encryption, integrity)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut c = SaConfig::new(
            spi,
            suite,
            key_arg("enc_key", enc_key)?,
            key_arg("integ_key", integ_key)?,
        );
        c.mode = Mode::from_name(mode).ok_or_else(|| {
            PyValueError::new_err(format!("mode: {mode:?} is not 'tunnel' or 'transport'"))
        })?;
        c.esn = esn;
        c.replay_window = replay_window;
        c.legacy = legacy;
        c.protocol = Protocol::from_name(protocol).ok_or_else(|| {
            PyValueError::new_err(format!("protocol: {protocol:?} is not 'esp' or 'ah'"))
        })?;
        let addr = |name: &str, a: &str| {
            a.parse()
                .map_err(|_| PyValueError::new_err(format!("{name}: {a:?} is not an IP address")))
        };
        c.tunnel = match (tunnel_src, tunnel_dst) {
            (Some(s), Some(d)) => Some(TunnelEndpoints {
                src: addr("tunnel_src", s)?,
                dst: addr("tunnel_dst", d)?,
            }),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "tunnel_src and tunnel_dst go together",
                ))
            }
        };
        Ok(PySa {
            sa: Sa::new(&c).map_err(|e| PyValueError::new_err(e.to_string()))?,
        })
    }

    /// Seal an IP packet (tunnel: add outer header; transport: insert ESP). `iv` and `seq`
    /// fix the IV and sequence number, for known-answer tests only.
    #[pyo3(signature = (packet, *, iv=None, seq=None))]
    fn seal<'py>(
        &mut self,
        py: Python<'py>,
        packet: &[u8],
        iv: Option<Vec<u8>>,
        seq: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if let Some(s) = seq {
            self.sa.set_next_seq(s).map_err(drop_err)?;
        }
        let mut buf = vec![0u8; HEADROOM + packet.len() + TAILROOM];
        buf[HEADROOM..HEADROOM + packet.len()].copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, HEADROOM, packet.len()).map_err(drop_err)?;
        let ivs = iv.as_deref().map_or(IvSource::Generate, IvSource::Fixed);
        self.sa.seal_with(&mut p, ivs).map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }

    /// Open an IP packet carrying ESP; returns the inner packet (tunnel) or the restored
    /// packet (transport). Raises DropError with the reason.
    fn open<'py>(&mut self, py: Python<'py>, packet: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; HEADROOM + packet.len()];
        buf[HEADROOM..].copy_from_slice(packet);
        let mut p = PacketBuf::new(&mut buf, HEADROOM, packet.len()).map_err(drop_err)?;
        self.sa.open(&mut p).map_err(drop_err)?;
        Ok(PyBytes::new(py, p.data()))
    }

    /// Seal a bare ESP payload with an explicit next header; returns SPI..ICV.
    #[pyo3(signature = (payload, next_header, *, iv=None, seq=None))]
    fn seal_esp<'py>(
        &mut self,
        py: Python<'py>,
        payload: &[u8],
        next_header: u8,
        iv: Option<Vec<u8>>,
        seq: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.esp_only("seal_esp")?;
        if let Some(s) = seq {
            self.sa.set_next_seq(s).map_err(drop_err)?;
        }
        let at = HEADROOM;
        let p0 = at + 8 + self.sa.suite().iv_len();
        let mut buf = vec![0u8; p0 + payload.len() + TAILROOM];
        buf[p0..p0 + payload.len()].copy_from_slice(payload);
        let ivs = iv.as_deref().map_or(IvSource::Generate, IvSource::Fixed);
        let n = self
            .sa
            .seal_esp(&mut buf, at, payload.len(), next_header, ivs)
            .map_err(drop_err)?;
        Ok(PyBytes::new(py, &buf[at..at + n]))
    }

    /// Open bare ESP bytes; returns (payload, next_header).
    fn open_esp<'py>(
        &mut self,
        py: Python<'py>,
        esp: &[u8],
    ) -> PyResult<(Bound<'py, PyBytes>, u8)> {
        self.esp_only("open_esp")?;
        let mut buf = vec![0u8; HEADROOM + esp.len()];
        buf[HEADROOM..].copy_from_slice(esp);
        let o = self
            .sa
            .open_esp(&mut buf, HEADROOM, esp.len())
            .map_err(drop_err)?;
        Ok((PyBytes::new(py, &buf[o.payload]), o.next_header))
    }

    /// Resume the receive window at `top` (highest sequence number already received).
    fn set_replay_top(&mut self, top: u64) {
        self.sa.set_replay_top(top);
    }

    /// Packets, bytes, and drops by reason (non-zero only).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let c = &self.sa.counters;
        d.set_item("packets", c.packets)?;
        d.set_item("bytes", c.bytes)?;
        set_drops_and_stages(&d, &c.drops, &self.sa.stages)?;
        Ok(d)
    }

    /// Switch per-stage timing on or off; `counters()["stages"]` then holds ns and calls.
    fn set_stage_timing(&mut self, on: bool) {
        self.sa.stages.set_clock(lent_clock(on));
    }

    #[getter]
    fn spi(&self) -> u32 {
        self.sa.spi()
    }
    #[getter]
    fn suite(&self) -> String {
        self.sa.suite().name()
    }
    #[getter]
    fn mode(&self) -> &'static str {
        self.sa.mode().name()
    }
    #[getter]
    fn protocol(&self) -> &'static str {
        self.sa.protocol().name()
    }
    #[getter]
    fn next_seq(&self) -> u64 {
        self.sa.next_seq()
    }
    #[getter]
    fn esn(&self) -> bool {
        self.sa.esn()
    }
    fn __repr__(&self) -> String {
        format!(
            "SecurityAssociation(spi={:#x}, suite={:?}, mode={:?}, esn={}, keys=<redacted>)",
            self.sa.spi(),
            self.sa.suite().name(),
            self.sa.mode().name(),
            self.sa.esn()
        )
    }
}
