//! The engine of one direction built from the config: its bundles and its policies, in
//! order, each naming its SAs (by name, from a map: a config of thousands of tunnels
//! builds in linear time).

use std::collections::HashMap;

use ipsec::sa::Direction;
use ipsec::sad::SaId;
use ipsec::spd::{Action, SpdRule};
use ipsec::{Engine, SaError};

use super::{BuildError, DirEngine, Kept, SaEntry};
use crate::config::{Config, PolicyAction};

/// The direction's SAs by name, each name's first entry (what a bundle's layer and a
/// policy's action name): one probe a name, not a scan of thousands of SAs per policy.
fn sa_ids(sas: &[SaEntry]) -> HashMap<&str, SaId> {
    let mut ids = HashMap::with_capacity(sas.len());
    for e in sas {
        ids.entry(e.name.as_str()).or_insert(e.id);
    }
    ids
}

/// The SA of this direction named `name` (a bundle's layer, a policy's action).
fn sa_id(ids: &HashMap<&str, SaId>, name: &str) -> Result<SaId, BuildError> {
    ids.get(name).copied().ok_or_else(|| BuildError::Unknown {
        what: "SA",
        name: name.to_string(),
    })
}

/// Each bundle of the direction as (name, engine bundle id, IPComp association id).
pub(super) type Bundles = Vec<(String, usize, Option<usize>)>;

/// A bundle's engine id and its SAs (ESP, and AH if it has one).
pub(super) type BundleSas = (usize, [Option<SaId>; 2]);

/// The direction's bundles (RFC 4301 §4.5: IPComp → ESP → AH, an SA per layer) into the
/// engine; with the SAs of each, for their lifetimes.
pub(super) fn add_bundles(
    engine: &mut Engine,
    cfg: &Config,
    direction: Direction,
    sas: &[SaEntry],
) -> Result<(Bundles, Vec<BundleSas>), BuildError> {
    let ids = sa_ids(sas);
    let id_of = |name: &str| sa_id(&ids, name);
    let mut bundles = Vec::new();
    let mut bundle_sas = Vec::new();
    for b in cfg.bundles.iter().filter(|b| b.direction == direction) {
        let named = |e: SaError| BuildError::Bundle {
            name: b.name.clone(),
            source: e,
        };
        let ipcomp = match b.ipcomp_cpi {
            Some(cpi) => Some(
                engine
                    .add_ipcomp(ipsec::IpcompConfig::new(cpi))
                    .map_err(named)?,
            ),
            None => None,
        };
        let esp = id_of(&b.esp)?;
        let ah = match b.ah.as_deref() {
            Some(n) => Some(id_of(n)?),
            None => None,
        };
        let bundle = ipsec::Bundle { ipcomp, esp, ah };
        let id = engine.add_bundle(bundle).map_err(named)?;
        bundles.push((b.name.clone(), id, ipcomp));
        bundle_sas.push((id, [Some(esp), ah]));
    }
    Ok((bundles, bundle_sas))
}

/// The direction's policies, in order (RFC 4301 §4.4.1: the SPD is ordered, the first
/// match decides), into the engine.
pub(super) fn add_policies(
    engine: &mut Engine,
    cfg: &Config,
    direction: Direction,
    sas: &[SaEntry],
    bundles: &Bundles,
) -> Result<(), BuildError> {
    let ids = sa_ids(sas);
    let id_of = |name: &str| sa_id(&ids, name);
    for p in cfg.policies.iter().filter(|p| p.direction == direction) {
        let action = match &p.action {
            PolicyAction::Bypass => Action::Bypass,
            PolicyAction::Discard => Action::Discard,
            PolicyAction::Protect(name) => Action::Protect(id_of(name)?),
            PolicyAction::ProtectBundle(name) => {
                let (_, id, _) = bundles.iter().find(|(n, _, _)| n == name).ok_or_else(|| {
                    BuildError::Unknown {
                        what: "bundle",
                        name: name.clone(),
                    }
                })?;
                Action::ProtectBundle(*id)
            }
        };
        let rule = SpdRule {
            selector: p.selector.clone(),
            action,
            also: p.also.iter().map(|n| id_of(n)).collect::<Result<_, _>>()?,
        };
        match direction {
            Direction::Out => engine.spd_out.push(rule),
            Direction::In => engine.spd_in.push(rule),
        }
    }
    Ok(())
}

/// What the SAs reloads took away had counted, summed.
#[derive(Clone, Debug, Default)]
pub(super) struct Removed {
    pub(super) sas: u64,
    pub(super) packets: u64,
    pub(super) bytes: u64,
    pub(super) drops: ipsec::drop::DropCounters,
}

/// What `old`'s earlier reloads took away, and its SAs this build did not move over,
/// their counters summed.
pub(super) fn removed(old: Option<&DirEngine>, kept: &Kept) -> Removed {
    let Some(o) = old else {
        return Default::default();
    };
    let mut r = o.removed.clone();
    for (i, e) in o.sas.iter().enumerate() {
        if kept.taken.get(i).copied().unwrap_or(false) {
            continue;
        }
        r.sas += 1;
        let live = if e.expired { None } else { o.engine.sa(e.id) };
        if let Some(sa) = live.or(e.retired.as_ref()) {
            r.packets += sa.counters.packets;
            r.bytes += sa.counters.bytes;
            r.drops.add(&sa.counters.drops);
        }
    }
    r
}
