# ipsec-lab — set-up and checks. Every target installs what it needs, idempotently.
#   make run    install, build, reproduce the four seed studies (--quick, ~3 min, as root)
#               and write the report; prints its path
#   make test   install, build, then every check: the host's root tests alone, then the
#               micro-VM's tests beside the host's other tests, the lints and cargo test,
#               then the bounded fuzzers

SHELL := /bin/bash
.DEFAULT_GOAL := run

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
NATIVE    := $(VENV)/.native
APT_PKGS  := build-essential pkg-config python3 python3-venv python3-dev git ca-certificates \
             iproute2 util-linux procps ethtool iperf3 curl nginx-light tcpdump \
             strongswan-charon strongswan-swanctl libcharon-extra-plugins chromium \
             qemu-system-x86 linux-image-amd64 busybox-static tcpreplay nftables iputils-ping \
             openssh-client openssh-server sudo python3-aiosmtpd netsniff-ng irtt \
             wireguard-go wireguard-tools
FUZZ_SECONDS ?= 60
IPCOMP_FUZZ_SECONDS ?= 20
SMALL_FUZZ_SECONDS ?= 20
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: run test deps apt rust venv native gateway lint cargo-test pytest pytest-root \
        pytest-unit pytest-vm \
        rust-checks fuzz fuzz-build fuzz-inbound fuzz-others bench-json clean boringtun

LAB ?= lab

# --if-changed: after `make test`, whose reproduction test ran this very command into the
# same lab with this same build, the campaigns are reused and the report written again.
run: native gateway
	$(VENV)/bin/ipsec-lab reproduce all --quick --lab $(LAB) --if-changed

# The host's root tests (and the few others that measure this machine: marker `quiet`)
# run with nothing beside them. Then the micro-VM's (tests/test_vm_root.py: about 16
# minutes under TCG, two lanes of steps at once in the VM) run beside the host's other
# tests, the lints, cargo test and the fuzzers' build (CPU only: no network, no
# namespaces; none rebuilds what the VM runs), each job's output printed whole when it
# ends; then the fuzzers. CI's wall time from a fresh clone here: 39.1 min at stop 63
# (docs/development.md "CI"; both cores busy beside the VM: what shortens it is less CPU
# there).
test: native gateway pytest-root
	$(MAKE) --no-print-directory -j3 --output-sync=target pytest-vm pytest-unit rust-checks
	$(MAKE) --no-print-directory -j2 --output-sync=target fuzz

# the lints, cargo test and the fuzzers' build, one after the other, at the lowest
# priority (a fixed amount of work: the VM beside them keeps its pace). The fuzzers run
# after the VM, in two lanes (their time is their bound: they keep theirs, and the VM's
# last step, the latency test, has the machine to itself).
rust-checks: rust venv
	nice -n 19 $(MAKE) --no-print-directory -j1 lint cargo-test fuzz-build

deps: apt rust venv boringtun

# boringtun-cli (Cloudflare's user-space WireGuard: the `boringtun` backend), crates.io's,
# at the version backends/userspace_wireguard.py names (BORINGTUN_VERSION there; a test holds the two
# equal), into /usr/local/bin once — a tool, as cargo-fuzz, not this project's build: on
# every root's PATH, sudo's and a host's over ssh alike. Its first build takes a few CPU-min.
BORINGTUN_VERSION := 0.7.1
boringtun: rust
	@/usr/local/bin/boringtun-cli --version 2>/dev/null | grep -qx "boringtun $(BORINGTUN_VERSION)" || { \
	  echo "installing boringtun-cli $(BORINGTUN_VERSION) (crates.io) into /usr/local/bin"; \
	  cargo install -q --locked boringtun-cli --version $(BORINGTUN_VERSION) --root /usr/local; }

# Debian packages: installed only when one is missing (needs root on a fresh machine). A
# package removed but not purged still answers `dpkg -s`: its status must say installed.
apt:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' \
	    || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# A Rust toolchain: the machine's rustup one if present, else Debian's.
rust: apt
	@command -v cargo >/dev/null 2>&1 || { echo "installing Debian's Rust toolchain"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc rustfmt rust-clippy; }
	@command -v cargo-fuzz >/dev/null 2>&1 || { echo "installing cargo-fuzz"; \
	  cargo install --locked cargo-fuzz; }

venv: $(STAMP)
$(STAMP): pyproject.toml Makefile | apt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "maturin>=1.5,<2" "rich>=13" "numpy>=1.24" "pytest>=8" "hypothesis>=6.100" \
	  "scapy>=2.6" "cryptography>=42" "ruff>=0.6" "mypy>=1.10" "psutil>=5.9" "types-psutil" \
	  "aiosmtpd>=1.4" "matplotlib>=3.7" "virtme-ng>=1.30"
	touch $@

# The release build of the engine, installed into the venv as ipsec_lab._native; then the
# bytecode of the lab and its tests, written now: where PYTHONDONTWRITEBYTECODE is set (CI
# here) or the tree is read-only (the micro-VM) nothing else writes it, and every process
# compiles its ~70 modules again (`ipsec-lab --help` 0.31 s instead of 0.15 here, 4 s
# more per start under TCG). Only what changed is compiled.
# The wheel is built again only when its sources changed ($(NATIVE) is its stamp): `make
# test`'s second phase asks for `native` again beside the VM, where a needless maturin
# run cost about 15 s of both cores (stop 63).
NATIVE_SRCS := $(shell find crates/ipsec crates/ipsec-py crates/ipsec-bench -name '*.rs' \
                 -o -name Cargo.toml 2>/dev/null) Cargo.toml Cargo.lock pyproject.toml
native: $(NATIVE)
	$(PY) -m compileall -q -j0 python tests benchmarks
$(NATIVE): $(STAMP) $(NATIVE_SRCS) | rust
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release -q
	touch $@

# The gateway daemon, target/release/ipsec-gw (the lab's `ours` backend runs it), and
# the unprivileged system user it runs as once set up (its config's `user`, default
# ipsec-gw; see the README's "least privilege").
GW_USER := ipsec-gw
gateway: rust
	cargo build --release -q -p ipsec-gw
	@id -u $(GW_USER) >/dev/null 2>&1 || { echo "creating the system user $(GW_USER)"; \
	  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin $(GW_USER); }

# clippy in the release profile: the build scripts' outputs (aws-lc-sys compiles AWS-LC's
# C) and the proc-macros are the release build's, not built again for a dev profile (53
# CPU-s against 125 from a fresh clone's state here); no code of ours is cfg'd on
# debug_assertions, so nothing goes unlinted
lint: rust venv
	cargo fmt --all -- --check
	cargo clippy --release --workspace --all-targets -q -- -D warnings
	cargo clippy --release -p ipsec-gw --features io-ceiling --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check python tests benchmarks
	$(VENV)/bin/ruff format --check python tests benchmarks
	$(VENV)/bin/mypy

cargo-test: rust
	cargo test --workspace --release -q

# --durations: the slowest tests, so CI's log says where its time goes. `pytest`: every
# test but the micro-VM's, in two sessions: `pytest-root`, those that build namespaces or
# measure this machine's CPU or rates (markers `root`, `quiet`: nothing may run beside
# them), then `pytest-unit`, the rest (CPU only: `make test` runs them beside the VM);
# `pytest-vm`: the micro-VM's (`make test` runs all three).
PYTEST_ROOT = IPSEC_LAB_REPRODUCE_LAB=$(abspath $(LAB)) \
  $(VENV)/bin/pytest -q --durations=25 -m "root or quiet" --ignore=tests/test_vm_root.py
# below the VM's priority beside it (what it takes, the VM loses), above the Rust checks'
PYTEST_UNIT = nice -n 10 $(VENV)/bin/pytest -q --durations=10 -m "not root and not quiet" \
  --ignore=tests/test_vm_root.py

pytest: native gateway boringtun  # one session after the other, even under -j
	$(PYTEST_ROOT)
	$(PYTEST_UNIT)

pytest-root: native gateway boringtun
	$(PYTEST_ROOT)

pytest-unit: native gateway
	$(PYTEST_UNIT)

pytest-vm: native gateway
	$(VENV)/bin/pytest -q --durations=5 tests/test_vm_root.py

# Bounded coverage-guided fuzzing (libFuzzer via cargo-fuzz on the stable toolchain:
# RUSTC_BOOTSTRAP lets it pass the sanitizer flags), optimised and with debug assertions
# and overflow checks on (-O -a), each target from its kept corpus in fuzz/corpus/<target>:
# the inbound path, IPComp, GRO into the TUN device (differential against tun-rs's
# segmentation), the replay window (against a set model), the gateway's config text
# to engines, and the crew's inbound path (differential against the single-thread one). Crashes are kept in fuzz/artifacts and become regression tests.
FUZZ_FLAGS = --sanitizer none -O -a
FUZZ = cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $(FUZZ_FLAGS)
FUZZ_ARGS = -rss_limit_mb=2048 -print_final_stats=1
# every target built once, with the runs' flags (each run then only starts its binary)
fuzz-build: rust
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build $(FUZZ_FLAGS)

# two lanes of 80 s each (with `-j2`, as `make test` runs them: the machine's two cores)
fuzz: fuzz-inbound fuzz-others

fuzz-inbound: fuzz-build
	$(FUZZ) inbound corpus/inbound -- -max_total_time=$(FUZZ_SECONDS) $(FUZZ_ARGS)
	$(FUZZ) config corpus/config -- -max_total_time=$(SMALL_FUZZ_SECONDS) -max_len=8192 $(FUZZ_ARGS)

fuzz-others: fuzz-build
	$(FUZZ) ipcomp corpus/ipcomp -- -max_total_time=$(IPCOMP_FUZZ_SECONDS) $(FUZZ_ARGS)
	$(FUZZ) gro corpus/gro -- -max_total_time=$(SMALL_FUZZ_SECONDS) $(FUZZ_ARGS)
	$(FUZZ) replay corpus/replay -- -max_total_time=$(SMALL_FUZZ_SECONDS) $(FUZZ_ARGS)
	mkdir -p fuzz/corpus/crew
	$(FUZZ) crew corpus/crew -- -max_total_time=$(SMALL_FUZZ_SECONDS) -max_len=1200 $(FUZZ_ARGS)

bench-json: native
	$(VENV)/bin/ipsec-lab bench --json

clean:
	rm -rf target fuzz/target $(VENV)
