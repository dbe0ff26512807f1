//! PyO3 glue only: `ipsec_lab._native`. Logic lives in the `ipsec` and `ipsec-bench` crates.

use std::time::Duration;

use ipsec::crypto::state::IvSource;
use ipsec::crypto::SecretBytes;
use ipsec::{
    Compressed, DropReason, IpcompConfig, IpcompSa, Mode, PacketBuf, Protocol, Sa, SaConfig, Suite,
    TunnelEndpoints, HEADROOM, TAILROOM,
};
use ipsec_bench::{BenchConfig, Op};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

pyo3::create_exception!(
    _native,
    DropError,
    PyException,
    "A packet was refused; args[0] is the drop reason (e.g. 'icv_failure')."
);

fn drop_err(d: DropReason) -> PyErr {
    DropError::new_err((
        d.label(),
        format!("packet dropped: {} ({})", d.label(), d.class()),
    ))
}

fn key_arg(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<SecretBytes> {
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

/// One IPsec security association (ESP). Keys are never shown by repr().
#[pyclass(name = "SecurityAssociation", module = "ipsec_lab._native")]
struct PySa {
    sa: Sa,
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

/// Run the engine benchmark (timing loop in Rust, one thread). Returns a list of dicts
/// with suite, mode, op, size, ns_per_packet, raw_ns_per_packet, l_alg.
#[pyfunction(name = "bench")]
#[pyo3(signature = (suites=None, sizes=None, modes=None, ops=None, budget_ms=100, trials=5, progress=None, stages=false))]
#[allow(clippy::too_many_arguments)]
fn run_bench<'py>(
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

/// The clock lent for per-stage timing when `on`.
fn lent_clock(on: bool) -> Option<ipsec::Clock> {
    on.then_some(ipsec_bench::mono_ns as ipsec::Clock)
}

/// A counters dict's `drops` (non-zero reasons) and `stages` entries.
fn set_drops_and_stages(
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
fn stage_dict<'py>(py: Python<'py>, st: &ipsec::StageTimes) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (label, ns, calls) in st.nonzero() {
        let e = PyDict::new(py);
        e.set_item("ns", ns)?;
        e.set_item("calls", calls)?;
        d.set_item(label, e)?;
    }
    Ok(d)
}

/// Benchmark whole configurations (an ESP or AH SA, or a bundle) on text or random
/// payloads. Returns dicts with config, payload, op, size, ns_per_packet, wire_len (and
/// stages, stage_points with `stages`).
#[pyfunction(name = "bench_configs")]
#[pyo3(signature = (configs, sizes, ops, payloads, budget_ms=100, trials=5, stages=false, progress=None))]
#[allow(clippy::too_many_arguments)]
fn run_bench_configs<'py>(
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
    use ipsec_bench::configs::{measure_config, ConfigSpec, Payload};
    let specs = configs
        .iter()
        .map(|c| ConfigSpec::parse(c).map_err(PyValueError::new_err))
        .collect::<PyResult<Vec<_>>>()?;
    check_sizes(&sizes)?;
    let ops = parse_ops(&ops)?;
    let payloads = payloads
        .iter()
        .map(|x| match x.as_str() {
            "text" => Ok(Payload::Text),
            "random" => Ok(Payload::Random),
            _ => Err(PyValueError::new_err(format!(
                "payload {x:?}: use text or random"
            ))),
        })
        .collect::<PyResult<Vec<_>>>()?;
    check_budget(budget_ms, trials)?;
    let total = specs.len() * sizes.len() * ops.len() * payloads.len();
    let budget = Duration::from_millis(budget_ms);
    let results = py.allow_threads(|| {
        let mut out = Vec::with_capacity(total);
        for spec in &specs {
            for &payload in &payloads {
                for &size in &sizes {
                    for &op in &ops {
                        out.push(measure_config(
                            spec, size, op, payload, budget, trials, stages,
                        ));
                        if let Some(cb) = &progress {
                            Python::with_gil(|py| {
                                let _ = cb.call1(py, (out.len(), total));
                            });
                        }
                    }
                }
            }
        }
        out
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
fn set_stage_split(
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

fn check_sizes(sizes: &[usize]) -> PyResult<()> {
    match sizes
        .iter()
        .find(|&&x| !(ipsec_bench::MIN_SIZE..=9000).contains(&x))
    {
        Some(bad) => Err(PyValueError::new_err(format!(
            "size {bad}: IP packet sizes must be {} to 9000 bytes",
            ipsec_bench::MIN_SIZE
        ))),
        None => Ok(()),
    }
}

fn parse_ops(ops: &[String]) -> PyResult<Vec<Op>> {
    ops.iter()
        .map(|x| match x.as_str() {
            "seal" => Ok(Op::Seal),
            "open" => Ok(Op::Open),
            _ => Err(PyValueError::new_err(format!("op {x:?}: use seal or open"))),
        })
        .collect()
}

fn check_budget(budget_ms: u64, trials: usize) -> PyResult<()> {
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
fn stage_off_cost_ns(py: Python<'_>, trials: usize) -> f64 {
    py.allow_threads(|| ipsec_bench::stage_off_cost_ns(trials))
}

/// The suites `bench` runs by default.
#[pyfunction]
fn default_suites() -> Vec<String> {
    Suite::bench_defaults().iter().map(Suite::name).collect()
}

/// Every algorithm's row of the engine's table (`crates/ipsec/src/crypto/table.rs`):
/// `{"encryption": [row, ...], "integrity": [row, ...]}`, each row a dict of its facts.
#[pyfunction]
fn algorithms(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
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
fn stages() -> Vec<(&'static str, bool)> {
    ipsec::Stage::ALL
        .iter()
        .map(|s| (s.label(), s.per_byte()))
        .collect()
}

/// Every drop reason label, in counter order.
#[pyfunction]
fn drop_reasons() -> Vec<&'static str> {
    DropReason::ALL.iter().map(|d| d.label()).collect()
}

/// An IPComp association (RFC 3173 §3: IPCA): DEFLATE per packet, no keys.
#[pyclass(name = "IpcompAssociation", module = "ipsec_lab._native")]
struct PyIpcomp {
    sa: IpcompSa,
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
            sa: IpcompSa::new(cfg).map_err(PyValueError::new_err)?,
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

/// An SA bundle (RFC 4301 §4.5): IPComp → ESP (tunnel) → AH outbound, reverse inbound.
/// It borrows its associations for each packet; their counters stay theirs.
#[pyclass(name = "SecurityBundle", module = "ipsec_lab._native")]
struct PyBundle {
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
                .map_err(PyValueError::new_err)?;
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySa>()?;
    m.add_class::<PyIpcomp>()?;
    m.add_class::<PyBundle>()?;
    m.add("DropError", m.py().get_type::<DropError>())?;
    m.add_function(wrap_pyfunction!(run_bench, m)?)?;
    m.add_function(wrap_pyfunction!(run_bench_configs, m)?)?;
    m.add_function(wrap_pyfunction!(default_suites, m)?)?;
    m.add_function(wrap_pyfunction!(stage_off_cost_ns, m)?)?;
    m.add_function(wrap_pyfunction!(algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(stages, m)?)?;
    m.add_function(wrap_pyfunction!(drop_reasons, m)?)?;
    m.add("DEFAULT_SIZES", ipsec_bench::DEFAULT_SIZES.to_vec())?;
    Ok(())
}
