//! The gateway's config, text to engines: any text either is refused by `config::parse`
//! with an error naming the file and a key, or parses into a config whose engines
//! `DirEngine::check` builds or refuses with an error — as `--check` does. Nothing may
//! panic: a config `--check` calls usable must start (the `replay_window = 100` class of
//! bug, where the config accepted what the engine panicked on). Inputs naming key files
//! (`@…`) are skipped: the fuzzer is not to read files.

#![no_main]

use std::path::Path;

use ipsec_gw::config;
use ipsec_gw::dataplane::DirEngine;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains('@') || text.len() > 16_384 {
        return;
    }
    match config::parse(text, Path::new("fuzz.toml")) {
        Err(e) => {
            let shown = e.to_string();
            assert!(shown.starts_with("fuzz.toml: "), "{shown}");
            assert!(!e.key.is_empty());
        }
        Ok(cfg) => {
            if let Err(e) = DirEngine::check(&cfg) {
                assert!(!e.to_string().is_empty());
            }
        }
    }
});
