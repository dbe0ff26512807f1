//! What a reload (SIGHUP) is checked against before the workers get it: a change only a
//! restart makes, the engines the new config would build, an SA that changes but keeps
//! its keys, and a key the other direction numbered under. Each refusal leaves the running
//! config in place.

use ipsec::sa::Direction;

use crate::{config, dataplane, seqstate};

/// A change only a restart makes: the TUN device (name, MTU, offloads), the outer
/// addresses, UDP encapsulation and `aqm` (the sockets' receive times), the routing table
/// and fwmark, the threads, the state, the stats socket and the user.
pub fn needs_restart(current: &config::Config, new: &config::Config) -> bool {
    (
        &new.tun,
        new.mtu,
        new.offload,
        new.workers,
        new.crypto_workers,
    ) != (
        &current.tun,
        current.mtu,
        current.offload,
        current.workers,
        current.crypto_workers,
    ) || (new.local, new.remote, new.udp_encap, new.aqm, new.tun_queue)
        != (
            current.local,
            current.remote,
            current.udp_encap,
            current.aqm,
            current.tun_queue,
        )
        || (new.table, new.fwmark) != (current.table, current.fwmark)
        || (&new.state, &new.stats, &new.user) != (&current.state, &current.stats, &current.user)
}

/// The keys (`seqstate::keys_of`) each direction's SAs held in any config this gateway
/// took: at start and every reload sent to the workers.
#[derive(Default)]
pub struct KeysTaken {
    out: std::collections::HashSet<seqstate::Key>,
    inb: std::collections::HashSet<seqstate::Key>,
}

impl KeysTaken {
    pub fn add(&mut self, cfg: &config::Config) {
        for s in &cfg.sas {
            let set = match s.config.direction {
                Direction::Out => &mut self.out,
                Direction::In => &mut self.inb,
            };
            set.extend(seqstate::keys_of(&s.config));
        }
    }
}

/// An SA of `new` under a key the other direction numbered under — recorded in that
/// direction's state (`states`: out, in) or held by one of its SAs in a config taken
/// before: the worker would refuse to build it
/// ([`dataplane::BuildError::KeyOfOtherDirection`]) and stop the gateway, or build it
/// before the other worker recorded the key. The reload is refused instead; the running
/// config stays.
pub fn key_of_other_direction(
    new: &config::Config,
    states: &[seqstate::Reader; 2],
    taken: &KeysTaken,
) -> Option<String> {
    let [out, inb] = states;
    let (out, inb) = match (out.read(), inb.read()) {
        (Ok(o), Ok(i)) => (o, i),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    new.sas
        .iter()
        .find(|s| {
            let (state, held) = match s.config.direction {
                Direction::Out => (&inb, &taken.inb),
                Direction::In => (&out, &taken.out),
            };
            let keys = seqstate::keys_of(&s.config);
            state.records_any(&keys) || keys.iter().any(|k| held.contains(k))
        })
        .map(|s| {
            dataplane::BuildError::KeyOfOtherDirection {
                name: s.name.clone(),
                spi: s.config.spi,
                direction: s.config.direction,
            }
            .to_string()
        })
}

/// Why a reload of `new` over `current` must be refused, if it must: the engines it
/// would build fail (every rule the engine enforces), or an SA changes what it does
/// while keeping its keys — the same keys under new parameters would restart or
/// reinterpret its sequence numbers (RFC 4301 §4.4.2: a changed SA is a new SA, which
/// needs new keys).
pub fn reload_problem(current: &config::Config, new: &config::Config) -> Option<String> {
    if let Err(e) = dataplane::DirEngine::check(new) {
        return Some(e.to_string());
    }
    // Any key of a new SA in a running one, whatever field, suite or direction holds
    // it, is that SA unchanged: found from the sorted keys of both (4,096 tunnels' SAs
    // against each other took a second of a reload); only where one is not, the pairs
    // in order below name the first, as always.
    let mut keys = Vec::new();
    for (side, cfg) in [(false, current), (true, new)] {
        for (i, s) in cfg.sas.iter().enumerate() {
            keys.extend(s.config.secrets().map(|k| (k.key, (side, i))));
        }
    }
    let changed = config::key_pairs(keys).into_iter().any(|(a, b)| {
        let (c, n) = match (a, b) {
            ((false, c), (true, n)) | ((true, n), (false, c)) => (c, n),
            _ => return false, // within one config: its own check's
        };
        !current.sas[c].same_as(&new.sas[n])
    });
    if !changed {
        return None;
    }
    for n in &new.sas {
        // any key of one in the other, whatever field, suite or direction holds it
        let shares_a_key = |c: &config::SaSpec| {
            c.config
                .secrets()
                .any(|a| n.config.secrets().any(|b| config::same_key(a.key, b.key)))
        };
        if let Some(c) = current
            .sas
            .iter()
            .find(|c| shares_a_key(c) && !c.same_as(n))
        {
            return Some(format!(
                "sa {} changes its parameters (SPI, protocol, direction, suite, mode, ESN, \
                 window or endpoints) but keeps a key of sa {}: give it new keys",
                n.name, c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two SAs, out and in, aes256-sha256, with these (enc_key, integ_key).
    fn cfg(out: (&str, &str), inb: (&str, &str)) -> config::Config {
        let text = format!(
            r#"
[gateway]
tun = "ipsec0"
local = "192.0.2.1"
remote = "192.0.2.2"
routes = ["10.2.0.0/24"]

[[sa]]
name = "out"
direction = "out"
spi = 0x1001
encryption = "aes256"
integrity = "sha256"
enc_key = "{}"
integ_key = "{}"

[[sa]]
name = "in"
direction = "in"
spi = 0x2002
encryption = "aes256"
integrity = "sha256"
enc_key = "{}"
integ_key = "{}"

[[policy]]
direction = "out"
src = "10.1.0.0/24"
dst = "10.2.0.0/24"
action = "protect"
sa = "out"

[[policy]]
direction = "in"
src = "10.2.0.0/24"
dst = "10.1.0.0/24"
action = "protect"
sa = "in"
"#,
            out.0, out.1, inb.0, inb.1
        );
        config::parse(&text, std::path::Path::new("gw.toml")).unwrap()
    }

    /// Each setting only a restart can change is refused at a reload, `aqm` among them
    /// (its receive times are switched on when the sockets are made).
    #[test]
    fn a_setting_only_a_restart_changes_is_refused_at_a_reload() {
        let (a, b, c, e) = (key(0x10, 32), key(0x30, 32), key(0x80, 32), key(0xa0, 32));
        let start = cfg((&a, &b), (&c, &e));
        assert!(!needs_restart(&start, &start.clone()));
        let mut on = start.clone();
        on.aqm = true;
        assert!(needs_restart(&start, &on) && needs_restart(&on, &start));
        let mut other = start.clone();
        other.udp_encap = true;
        assert!(needs_restart(&start, &other));
        let mut queue = start.clone();
        queue.tun_queue = config::TunQueue::Fixed(64);
        assert!(needs_restart(&start, &queue));
    }

    fn key(seed: u8, n: usize) -> String {
        (0..n)
            .map(|i| format!("{:02x}", seed.wrapping_add(i as u8)))
            .collect()
    }

    /// A burst of reloads: R1 put key K on the inbound SA, R2 took it away, R3 puts it
    /// on the outbound SA — before the inbound worker built R1, no state records K, yet
    /// R3 is refused (the worker would otherwise stop the gateway on it, or seal under
    /// K while the peer still sends under it). Likewise a key the outbound side took,
    /// for an inbound SA; and a key a state records. Keys of neither: accepted.
    #[test]
    fn a_key_the_other_direction_took_is_refused_before_any_state_records_it() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let mut st_out = seqstate::SeqState::open(&d.join("s.out"), Direction::Out, true).unwrap();
        let st_in = seqstate::SeqState::open(&d.join("s.in"), Direction::In, true).unwrap();
        let states = [st_out.reader().unwrap(), st_in.reader().unwrap()];
        let (a, b, c, e) = (key(0x10, 32), key(0x30, 32), key(0x80, 32), key(0xa0, 32));
        let k = key(0x40, 32);
        let start = cfg((&a, &b), (&c, &e));
        let mut taken = KeysTaken::default();
        taken.add(&start);
        assert_eq!(key_of_other_direction(&start, &states, &taken), None);
        // R1: K as the inbound SA's enc_key (sent to the workers, built by neither yet)
        let r1 = cfg((&a, &b), (&k, &e));
        assert_eq!(key_of_other_direction(&r1, &states, &taken), None);
        taken.add(&r1);
        // R3 (R2 took K away again): K as the outbound SA's enc_key
        let why = key_of_other_direction(&cfg((&k, &b), (&c, &e)), &states, &taken);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("records a key of this outbound SA")),
            "{why:?}"
        );
        // the mirror: an inbound SA under a key the outbound side took, either field
        let (g, h) = (key(0x60, 32), key(0x70, 32));
        for inb in [(a.as_str(), e.as_str()), (c.as_str(), b.as_str())] {
            let why =
                key_of_other_direction(&cfg((&g, &h), inb), &states, &taken).expect("refused");
            assert!(why.contains("records a key of this inbound SA"), "{why}");
            assert!(!why.contains(&a) && !why.contains(&b), "a key in a message");
        }
        // one a state records (a key no config of this process took)
        let fresh = KeysTaken::default();
        let z = key(0xc0, 32);
        assert_eq!(
            key_of_other_direction(&cfg((&a, &b), (&z, &e)), &states, &fresh),
            None
        );
        for fp in seqstate::keys_of(&cfg((&z, &b), (&c, &e)).sas[0].config) {
            st_out.set(fp, seqstate::Entry::default());
        }
        st_out.save().unwrap();
        let why = key_of_other_direction(&cfg((&a, &b), (&z, &e)), &states, &fresh).unwrap();
        assert!(why.contains("the outbound sequence state records"), "{why}");
    }
}
