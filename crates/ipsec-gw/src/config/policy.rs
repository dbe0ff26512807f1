//! `[[bundle]]` and `[[policy]]`: bundles of existing SAs, policies naming an SA or a
//! bundle, and SAs no policy uses.

use super::*;
use crate::prefixes::PrefixMap;
use std::collections::HashSet;

/// The names the bundles checked so far hold, by hash: each check linear in the config's
/// size, not in the product of its bundles, SAs and policies.
#[derive(Default)]
pub(super) struct Bundles {
    /// bundle name -> its position in the list
    named: HashMap<String, usize>,
    /// the SAs in some bundle
    in_one: HashSet<String>,
}

impl Bundles {
    pub(super) fn add(&mut self, at: usize, b: &BundleSpec) {
        self.named.insert(b.name.clone(), at);
        self.in_one.insert(b.esp.clone());
        self.in_one.extend(b.ah.clone());
    }
}

/// `bundle[i]`: its SAs exist, are of its direction and protocol, and in no other bundle.
pub(super) fn bundle(
    cx: &Ctx<'_>,
    (i, b): (usize, &RawBundle),
    sas: &[SaSpec],
    sa_named: &HashMap<&str, usize>,
    bundles: &Bundles,
) -> Result<BundleSpec, ConfigError> {
    let k = |f: &str| format!("bundle[{i}].{f}");
    if bundles.named.contains_key(&b.name) || b.name.is_empty() {
        return Err(cx.err(k("name"), format!("{:?}: empty or used twice", b.name)));
    }
    let direction = match b.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    let layer = |f: &str, name: &str, want: Protocol| -> Result<(), ConfigError> {
        let sa = sa_named
            .get(name)
            .map(|&at| &sas[at])
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
        if bundles.in_one.contains(name) {
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

/// `policy[i]`: its selector and action, checked against the SAs and bundles.
pub(super) fn policy(
    cx: &Ctx<'_>,
    (i, p): (usize, &RawPolicy),
    sas: &[SaSpec],
    sa_named: &HashMap<&str, usize>,
    bundles: (&[BundleSpec], &Bundles),
) -> Result<PolicySpec, ConfigError> {
    let (bundle_list, bundles) = bundles;
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
    let in_bundle = |name: &str| bundles.in_one.contains(name);
    let named = |name: &str| {
        sa_named
            .get(name)
            .map(|&at| &sas[at])
            .ok_or_else(|| cx.err(k("sa"), format!("no SA named {name:?} in this file")))
    };
    // `sa` as a list: inbound only, each named once; its first is the policy's SA, the
    // rest are let in beside it (a rekey's old SA, RFC 7296 §2.8)
    let (first, also): (Option<String>, Vec<String>) = match &p.sa {
        None => (None, Vec::new()),
        Some(OneOrMore::One(n)) => (Some(n.clone()), Vec::new()),
        Some(OneOrMore::More(names)) => {
            if direction == Direction::Out {
                return Err(cx.err(
                    k("sa"),
                    "an outbound policy seals with one SA (a list of SAs is for inbound \
                     policies, during a rekey)",
                ));
            }
            let Some((first, rest)) = names.split_first() else {
                return Err(cx.err(k("sa"), "an empty list: name the SA (or SAs) it lets in"));
            };
            let mut seen = HashSet::new();
            if let Some(twice) = names.iter().find(|n| !seen.insert(n.as_str())) {
                return Err(cx.err(k("sa"), format!("SA {twice:?} is named twice")));
            }
            (Some(first.clone()), rest.to_vec())
        }
    };
    if !also.is_empty() && matches!(p.action.as_str(), "bypass" | "discard") {
        return Err(cx.err(k("sa"), format!("a {} policy takes no SA", p.action)));
    }
    let action = match (p.action.as_str(), &first) {
        ("protect", None) if p.bundle.is_some() => {
            let name = p.bundle.as_deref().unwrap_or_default();
            let b = bundles
                .named
                .get(name)
                .map(|&at| &bundle_list[at])
                .ok_or_else(|| {
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
            let sa = named(name)?;
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
    for name in &also {
        if in_bundle(name) {
            return Err(cx.err(
                k("sa"),
                format!("SA {name:?} is in a bundle: a list of SAs takes single SAs"),
            ));
        }
        let sa = named(name)?;
        if sa.config.direction != direction {
            return Err(cx.err(
                k("sa"),
                format!("SA {name:?} is outbound, this policy is in"),
            ));
        }
        // the SAs of one policy are one SA's generations: a list that let in an SA of
        // another protocol, mode or peer would let that peer speak for this selector
        let lead = &named(first.as_deref().unwrap_or_default())?.config;
        let c = &sa.config;
        if (c.protocol, c.mode, c.tunnel) != (lead.protocol, lead.mode, lead.tunnel) {
            return Err(cx.err(
                k("sa"),
                format!(
                    "SA {name:?} is not of the first SA's protocol, mode and tunnel \
                     endpoints: the SAs of one policy are the old and the new of a rekey"
                ),
            ));
        }
    }
    Ok(PolicySpec {
        direction,
        selector,
        action,
        also,
    })
}

/// A warning for each policy that overlaps an earlier one of its direction, naming both
/// (RFC 4301 §4.4.1: the first that matches wins, so the later one sees only what the
/// earlier leaves). Two selectors overlap only where their destinations do — one prefix
/// within the other — so each policy is compared with the earlier ones of a destination
/// that contains its own or lies within it ([`PrefixMap`]), and with those of any
/// destination: linear in the policies when tunnels
/// have their own destinations (4,096 tunnels' 8,192 policies pair by pair were 33 M
/// comparisons), and as [`Selector::overlaps`] decides pair by pair (a property test
/// holds the two equal).
pub(super) fn overlap_warnings(cx: &Ctx<'_>, policies: &[PolicySpec], warnings: &mut Vec<String>) {
    for (i, j) in overlapping(policies) {
        warnings.push(format!(
            "{}: policy[{i}] overlaps policy[{j}]: the first one that matches wins \
             (RFC 4301 §4.4.1)",
            cx.file.display()
        ));
    }
}

/// Every (later, earlier) pair of policies of one direction whose selectors overlap, in
/// the order of the later, then the earlier.
pub(super) fn overlapping(policies: &[PolicySpec]) -> Vec<(usize, usize)> {
    // per direction: the earlier policies by destination, and those of any destination
    #[derive(Default)]
    struct Earlier {
        by_dst: PrefixMap<usize>,
        any_dst: Vec<usize>,
        all: Vec<usize>,
    }
    let mut dirs: [Earlier; 2] = Default::default();
    let mut out = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let e = &mut dirs[usize::from(p.direction == Direction::In)];
        let mut cands: Vec<usize> = match &p.selector.dst {
            None => e.all.clone(),
            Some(d) => e
                .any_dst
                .iter()
                .chain(e.by_dst.meeting(d))
                .copied()
                .collect(),
        };
        cands.sort_unstable();
        out.extend(
            cands
                .into_iter()
                .filter(|&j| policies[j].selector.overlaps(&p.selector))
                .map(|j| (i, j)),
        );
        match &p.selector.dst {
            None => e.any_dst.push(i),
            Some(d) => e.by_dst.insert(d, i),
        }
        e.all.push(i);
    }
    out
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
                used_sas.extend(p.also.iter().map(String::as_str));
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

#[cfg(test)]
mod tests {
    use super::*;
    use ipsec::spd::Selector;

    /// The overlap warnings through the destination index name exactly the pairs the
    /// pairwise comparison names, in its order — over random policy sets of both families,
    /// directions, nested and disjoint destination prefixes of every length from /0, any
    /// destination, sources, protocols and port ranges (the same cases every run). Fails
    /// when the index misses a containing or a contained prefix, a family or an
    /// any-destination policy.
    #[test]
    fn overlap_warnings_name_the_pairs_the_pairwise_check_names() {
        struct Rng(u64);
        impl Rng {
            fn below(&mut self, n: u64) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0 % n
            }
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut pairs = 0;
        for case in 0..400 {
            let n = 1 + rng.below(if case % 10 == 0 { 200 } else { 40 }) as usize;
            let prefix = |rng: &mut Rng| -> Option<Prefix> {
                if rng.below(8) == 0 {
                    return None;
                }
                // few distinct bits, so prefixes nest and collide
                let (addr, w): (IpAddr, u64) = if rng.below(3) == 0 {
                    let a = 0x2001_0db8_u128 << 96 | u128::from(rng.below(4) as u32) << 88;
                    (std::net::Ipv6Addr::from(a).into(), 128)
                } else {
                    let a = 10 << 24 | (rng.below(4) as u32) << 16 | (rng.below(3) as u32) << 8;
                    (std::net::Ipv4Addr::from(a).into(), 32)
                };
                let len = [0, 1, 8, 14, 16, 23, 24, 32, w][rng.below(9) as usize].min(w);
                Some(Prefix::new(addr, len as u8).unwrap())
            };
            let policies: Vec<PolicySpec> = (0..n)
                .map(|_| {
                    let ports = |rng: &mut Rng| match rng.below(3) {
                        0 => 0..=u16::MAX,
                        1 => 500..=500,
                        _ => 1000..=2000,
                    };
                    PolicySpec {
                        direction: if rng.below(2) == 0 {
                            Direction::Out
                        } else {
                            Direction::In
                        },
                        selector: Selector {
                            src: prefix(&mut rng),
                            dst: prefix(&mut rng),
                            protocol: [None, Some(6), Some(17)][rng.below(3) as usize],
                            src_ports: ports(&mut rng),
                            dst_ports: ports(&mut rng),
                        },
                        action: PolicyAction::Bypass,
                        also: Vec::new(),
                    }
                })
                .collect();
            let mut pairwise = Vec::new();
            for (i, p) in policies.iter().enumerate() {
                for (j, q) in policies[..i].iter().enumerate() {
                    if q.direction == p.direction && q.selector.overlaps(&p.selector) {
                        pairwise.push((i, j));
                    }
                }
            }
            assert_eq!(overlapping(&policies), pairwise, "case {case}");
            pairs += pairwise.len();
        }
        assert!(
            pairs > 10_000,
            "only {pairs} overlapping pairs: the cases do not nest"
        );
    }
    fn err(text: &str) -> ConfigError {
        parse(text, Path::new("gw.toml")).expect_err("should be refused")
    }

    /// A rekey made before it breaks: an inbound policy names the new SA and the old one
    /// (`sa = [..]`), both let in, neither warned about as unused. A list anywhere else, or
    /// one that names an SA twice, none, one missing, of the other direction or in a bundle,
    /// is refused naming the policy's `sa`.
    #[test]
    fn an_inbound_policy_may_name_a_rekeys_two_sas() {
        let new_in = "\n[[sa]]\nname = \"in-2\"\ndirection = \"in\"\nspi = 0x2003\n\
                      encryption = \"aes128gcm16\"\n\
                      enc_key = \"a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3\"\n\
                      \n[[sa]]\nname = \"in-t\"\ndirection = \"in\"\nspi = 0x2004\n\
                      mode = \"transport\"\nencryption = \"aes128gcm16\"\n\
                      enc_key = \"c0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3\"\n\
                      \n[[sa]]\nname = \"in-p\"\ndirection = \"in\"\nspi = 0x2005\n\
                      protocol = \"ah\"\nencryption = \"null\"\nintegrity = \"sha256\"\n\
                      integ_key = \"d0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeef\"\n";
        let at_end = |sa: &str| {
            let text = format!("{}{new_in}", crate::config::tests::GOOD);
            let (head, tail) = text.split_at(text.find("sa = \"in\"").unwrap());
            format!("{head}{}", tail.replacen("sa = \"in\"", sa, 1))
        };
        let c = parse(&at_end("sa = [\"in-2\", \"in\"]"), Path::new("gw.toml")).unwrap();
        let p = &c.policies[1];
        assert_eq!(p.direction, Direction::In);
        assert!(matches!(&p.action, PolicyAction::Protect(n) if n == "in-2"));
        assert_eq!(p.also, vec!["in".to_string()]);
        // the two it names are used (the transport and AH SAs of the refusals below not)
        let unused = |n: &str| {
            c.warnings
                .iter()
                .any(|w| w.contains(&format!("({n}) is used")))
        };
        assert!(
            !unused("in") && !unused("in-2") && unused("in-t"),
            "{:?}",
            c.warnings
        );
        // one name as a list of one: as `sa = "in"`, the new SA then unused
        let c = parse(&at_end("sa = [\"in\"]"), Path::new("gw.toml")).unwrap();
        assert!(c.policies[1].also.is_empty());
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("(in-2) is used by no policy")),
            "{:?}",
            c.warnings
        );
        for (sa, says) in [
            ("sa = []", "an empty list"),
            ("sa = [\"in\", \"in\"]", "named twice"),
            ("sa = [\"in-2\", \"nope\"]", "no SA named \"nope\""),
            ("sa = [\"in-2\", \"out\"]", "is outbound"),
            (
                "sa = [\"in-2\", \"in-t\"]",
                "not of the first SA's protocol, mode",
            ),
            (
                "sa = [\"in-2\", \"in-p\"]",
                "not of the first SA's protocol, mode",
            ),
        ] {
            let e = err(&at_end(sa));
            assert_eq!(e.key, "policy[1].sa", "{sa}: {e}");
            assert!(e.to_string().contains(says), "{sa}: {e}");
        }
        // not names at all: the line, and what is wanted
        let e = err(&at_end("sa = [\"in-2\", 7]"));
        assert!(e.key.starts_with("line "), "{e}");
        assert!(e.message.contains("expected a string"), "{e}");
        let e = err(&at_end("sa = 7"));
        assert!(e.message.contains("an SA's name, or"), "{e}");
        // outbound: one SA seals
        let text = format!("{}{new_in}", crate::config::tests::GOOD).replacen(
            "sa = \"out\"",
            "sa = [\"out\"]",
            1,
        );
        let e = err(&text);
        assert_eq!(e.key, "policy[0].sa");
        assert!(e.message.contains("seals with one SA"), "{e}");
        // bypass and discard take none
        let text = at_end("sa = [\"in-2\", \"in\"]").replace(
            "action = \"protect\"\nsa = [",
            "action = \"bypass\"\nsa = [",
        );
        let e = err(&text);
        assert_eq!(e.key, "policy[1].sa");
        assert!(e.message.contains("a bypass policy takes no SA"), "{e}");
    }
}
