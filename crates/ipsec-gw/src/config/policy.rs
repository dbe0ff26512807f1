//! `[[bundle]]` and `[[policy]]`: bundles of existing SAs, policies naming an SA or a
//! bundle, and SAs no policy uses.

use super::*;
use std::collections::HashSet;

/// `bundle[i]`: its SAs exist, are of its direction and protocol, and in no other bundle.
pub(super) fn bundle(
    cx: &Ctx<'_>,
    (i, b): (usize, &RawBundle),
    sas: &[SaSpec],
    bundles: &[BundleSpec],
) -> Result<BundleSpec, ConfigError> {
    let k = |f: &str| format!("bundle[{i}].{f}");
    if bundles.iter().any(|x| x.name == b.name) || b.name.is_empty() {
        return Err(cx.err(k("name"), format!("{:?}: empty or used twice", b.name)));
    }
    let direction = match b.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    let layer = |f: &str, name: &str, want: Protocol| -> Result<(), ConfigError> {
        let sa = sas
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| cx.err(k(f), format!("no SA named {name:?} in this file")))?;
        if sa.config.protocol != want {
            return Err(cx.err(k(f), format!("SA {name:?} is not {}", want.name())));
        }
        if sa.config.direction != direction {
            return Err(cx.err(k(f), format!("SA {name:?} is of the other direction")));
        }
        if want == Protocol::Esp && sa.config.mode != Mode::Tunnel {
            return Err(cx.err(
                k(f),
                "a bundle's ESP SA is tunnel mode (it builds the outer header)",
            ));
        }
        let taken = bundles
            .iter()
            .any(|x| x.esp == name || x.ah.as_deref() == Some(name));
        if taken {
            return Err(cx.err(k(f), format!("SA {name:?} is already in a bundle")));
        }
        Ok(())
    };
    layer("esp", &b.esp, Protocol::Esp)?;
    if let Some(ah) = &b.ah {
        layer("ah", ah, Protocol::Ah)?;
    }
    if let Some(cpi) = b.ipcomp_cpi {
        ipsec::IpcompConfig::new(cpi)
            .check()
            .map_err(|e| cx.err(k("ipcomp_cpi"), e))?;
    }
    Ok(BundleSpec {
        name: b.name.clone(),
        direction,
        esp: b.esp.clone(),
        ah: b.ah.clone(),
        ipcomp_cpi: b.ipcomp_cpi,
    })
}

/// `policy[i]`: its selector and action, checked against the SAs and bundles; an overlap
/// with an earlier policy of its direction is a warning (the first match wins).
pub(super) fn policy(
    cx: &Ctx<'_>,
    (i, p): (usize, &RawPolicy),
    sas: &[SaSpec],
    sa_named: &HashMap<&str, usize>,
    bundles: &[BundleSpec],
    policies: &[PolicySpec],
    warnings: &mut Vec<String>,
) -> Result<PolicySpec, ConfigError> {
    let k = |f: &str| format!("policy[{i}].{f}");
    let direction = match p.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    let pfx = |f: &str, v: &Option<String>| -> Result<Option<Prefix>, ConfigError> {
        v.as_deref()
            .map(Prefix::parse)
            .transpose()
            .map_err(|e| cx.err(k(f), e))
    };
    let selector = Selector {
        src: pfx("src", &p.src)?,
        dst: pfx("dst", &p.dst)?,
        protocol: p.protocol,
        ..Selector::default()
    };
    let in_bundle = |name: &str| {
        bundles
            .iter()
            .any(|b| b.esp == name || b.ah.as_deref() == Some(name))
    };
    let action = match (p.action.as_str(), &p.sa) {
        ("protect", None) if p.bundle.is_some() => {
            let name = p.bundle.as_deref().unwrap_or_default();
            let b = bundles.iter().find(|b| b.name == name).ok_or_else(|| {
                cx.err(
                    k("bundle"),
                    format!("no bundle named {name:?} in this file"),
                )
            })?;
            if b.direction != direction {
                return Err(cx.err(
                    k("bundle"),
                    format!("bundle {name:?} is of the other direction"),
                ));
            }
            PolicyAction::ProtectBundle(name.to_string())
        }
        (_, Some(_)) if p.bundle.is_some() => {
            return Err(cx.err(k("bundle"), "a policy names an SA or a bundle, not both"))
        }
        ("protect", Some(name)) if in_bundle(name) => {
            return Err(cx.err(
                k("sa"),
                format!("SA {name:?} is in a bundle: protect with the bundle"),
            ))
        }
        ("protect", Some(name)) => {
            let sa = sa_named
                .get(name.as_str())
                .map(|&at| &sas[at])
                .ok_or_else(|| cx.err(k("sa"), format!("no SA named {name:?} in this file")))?;
            if sa.config.direction != direction {
                return Err(cx.err(
                    k("sa"),
                    format!(
                        "SA {name:?} is {}bound, this policy is {}",
                        if sa.config.direction == Direction::Out {
                            "out"
                        } else {
                            "in"
                        },
                        p.direction
                    ),
                ));
            }
            PolicyAction::Protect(name.clone())
        }
        ("protect", None) => {
            return Err(cx.err(
                k("sa"),
                "a protect policy names the SA (or `bundle`) to protect with",
            ))
        }
        ("bypass", None) => PolicyAction::Bypass,
        ("discard", None) => PolicyAction::Discard,
        ("bypass" | "discard", Some(_)) => {
            return Err(cx.err(k("sa"), format!("a {} policy takes no SA", p.action)))
        }
        (a, _) => {
            return Err(cx.err(
                k("action"),
                format!("{a:?}: must be protect, bypass or discard"),
            ))
        }
    };
    for (j, q) in policies.iter().enumerate() {
        if q.direction == direction && q.selector.overlaps(&selector) {
            warnings.push(format!(
                "{}: policy[{i}] overlaps policy[{j}]: the first one that matches wins \
                 (RFC 4301 §4.4.1)",
                cx.file.display()
            ));
        }
    }
    Ok(PolicySpec {
        direction,
        selector,
        action,
    })
}

/// A warning for each SA no policy uses (directly or through its bundle).
pub(super) fn unused_sas(
    cx: &Ctx<'_>,
    sas: &[SaSpec],
    bundles: &[BundleSpec],
    policies: &[PolicySpec],
    warnings: &mut Vec<String>,
) {
    // the names policies use, then the SAs of the bundles they use: linear in the
    // config's size (4,096 tunnels' SAs against their policies, pair by pair, took most
    // of a second of `--check`)
    let mut used_sas: HashSet<&str> = HashSet::new();
    let mut used_bundles: HashSet<&str> = HashSet::new();
    for p in policies {
        match &p.action {
            PolicyAction::Protect(n) => {
                used_sas.insert(n);
            }
            PolicyAction::ProtectBundle(n) => {
                used_bundles.insert(n);
            }
            PolicyAction::Bypass | PolicyAction::Discard => {}
        }
    }
    for b in bundles
        .iter()
        .filter(|b| used_bundles.contains(b.name.as_str()))
    {
        used_sas.insert(&b.esp);
        if let Some(ah) = &b.ah {
            used_sas.insert(ah);
        }
    }
    for (i, s) in sas.iter().enumerate() {
        if !used_sas.contains(s.name.as_str()) {
            warnings.push(format!(
                "{}: sa[{i}] ({}) is used by no policy",
                cx.file.display(),
                s.name
            ));
        }
    }
}
