"""`ipsec-lab reproduce`: run each seed study's campaigns in order and hand their runs to
the study's analysis. Campaigns are ordinary lab campaigns (same store, `results`,
`--resume`), named `STUDY:ROLE` (`:quick` added for `--quick`) so the report finds them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipsec_lab import environment, runner, scenario, studies
from ipsec_lab.runner import Campaign
from ipsec_lab.store import Store

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

Done = dict[str, list[dict[str, Any]]]  # role -> runs


@dataclass
class StudyRun:
    study: str
    campaigns: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # role -> why
    reused: list[str] = field(default_factory=list)  # roles whose finished campaign --resume kept
    failed: dict[str, int] = field(default_factory=dict)  # role -> failed runs
    seconds: float = 0.0


def parse_name(name: str) -> tuple[str, str, bool] | None:
    """(study, role, quick) of a campaign `reproduce` made, else None."""
    parts = name.split(":")
    if len(parts) in (2, 3) and parts[0] in studies.NAMES:
        if len(parts) == 3 and parts[2] != "quick":
            return None
        return parts[0], parts[1], len(parts) == 3
    return None


def load_runs(store: Store, campaign: int) -> list[dict[str, Any]]:
    """A campaign's runs with their CPU series, each carrying what the analyses need from
    the campaign: the gateway CPU quota and this CPU's clock."""
    camp = store.campaign(campaign)
    if camp is None:
        raise ValueError(f"no campaign {campaign}")
    sc = scenario.parse(camp["scenario_text"], camp["scenario_path"])
    env = json.loads(camp["environment"])
    runs = store.runs(campaign, samples=True)
    for r in runs:
        r["cpu_quota"] = sc.gateway.cpu_quota
        r["cpu_mhz"] = env.get("cpu_mhz")
    return runs


def run_study(
    name: str,
    lab: Path,
    quick: bool,
    backends: tuple[str, ...],
    resume: bool,
    run_campaign: Callable[[Campaign], None],
    on_start: Callable[[str, str, Campaign], None] = lambda s, r, c: None,
    hosts: dict[str, Hosts] | None = None,
    if_changed: bool = False,
) -> StudyRun:
    """Run study `name`'s campaigns in order. `run_campaign` runs one (the CLI wraps it in
    a progress display); a campaign that fails raises and leaves the finished ones.
    `if_changed`: a campaign of the same scenario that this very build finished on this
    machine is used as it is (`make run` after `make test` measures nothing twice).
    `hosts` (topology -> hosts file): run on real hosts; a campaign whose topology has
    no hosts file is skipped, saying so."""
    mod = studies.module(name)
    out = StudyRun(name)
    t0 = time.monotonic()
    done: Done = {}
    now = runner.here() if if_changed else {}

    def here(env: dict[str, Any]) -> bool:
        return environment.same_place(env, now)

    for role in mod.roles(quick, backends):
        text = mod.scenario(role, quick, backends, done)
        if isinstance(text, studies.Skip):
            out.skipped[role] = text.reason
            continue
        if resume or if_changed:
            # --resume: a campaign of this very scenario that already finished is used
            # as it is; only unfinished or new ones run. --if-changed: only one this
            # build finished here.
            store = Store(lab / "results.sqlite")
            try:
                finished = store.finished_with(text, where=None if resume else here)
                if finished is not None:
                    out.campaigns[role] = finished
                    out.reused.append(role)
                    done[role] = load_runs(store, finished)
                    continue
            finally:
                store.close()
        sc = scenario.parse(text, f"ipsec-lab reproduce {name} ({role})")
        on_hosts = None
        if hosts is not None:
            on_hosts = hosts.get(sc.topology)
            if on_hosts is None:
                out.skipped[role] = (f"no hosts file for topology {sc.topology!r} (--hosts "
                                     f"gave {', '.join(sorted(hosts)) or 'none'})")  # fmt: skip
                continue
        campaign = Campaign(sc, lab, resume=resume, hosts=on_hosts)
        on_start(name, role, campaign)
        try:
            run_campaign(campaign)
        finally:
            out.campaigns[role] = campaign.id
        if campaign.progress.failed:
            out.failed[role] = campaign.progress.failed
        done[role] = load_runs(campaign.store, campaign.id)
        campaign.store.close()
    out.seconds = time.monotonic() - t0
    return out


def latest_campaigns(store: Store, ids: list[int] | None = None) -> dict[str, dict[str, int]]:
    """study -> role -> campaign id: the given campaigns, or else the newest campaign of
    each study and role in the store (quick or full, whichever ran last)."""
    out: dict[str, dict[str, int]] = {}
    rows = store.campaigns()
    if ids:
        known = {int(r["id"]): r for r in rows}
        for i in ids:
            if i not in known:
                raise ValueError(f"no campaign {i} in {store.path}")
            parsed = parse_name(known[i]["name"])
            if parsed is None:
                raise ValueError(
                    f"campaign {i} ({known[i]['name']!r}) is not a study reproduction "
                    "(made by `ipsec-lab reproduce`)"
                )
            out.setdefault(parsed[0], {})[parsed[1]] = i
        return out
    for r in rows:  # in id order: later ones win
        parsed = parse_name(r["name"])
        if parsed and r["n_runs"]:
            out.setdefault(parsed[0], {})[parsed[1]] = int(r["id"])
    return out


def analyse(store: Store, chosen: dict[str, dict[str, int]]) -> list[studies.Analysis]:
    out = []
    quick = {int(c["id"]): (parse_name(c["name"]) or ("", "", False))[2] for c in store.campaigns()}
    for name in studies.NAMES:
        if name not in chosen:
            continue
        done = {role: load_runs(store, cid) for role, cid in chosen[name].items()}
        an = studies.module(name).analyse(done)
        an.campaigns = dict(chosen[name])
        an.failures = failures(done, chosen[name])
        an.quick = any(quick[cid] for cid in chosen[name].values())
        out.append(an)
    return out


def failures(done: Done, campaigns: dict[str, int]) -> list[str]:
    """One line per distinct failure in a study's campaigns: which runs (how many) and
    why (the reason's first line; `ipsec-lab results ID` shows the whole with log tails)."""
    out: dict[tuple[str, str], int] = {}
    for role, runs in done.items():
        for r in runs:
            if r["status"] == "failed":
                why = (r["reason"] or "no reason recorded").split("\n")[0]
                what = (
                    f"campaign {campaigns.get(role, '?')} ({role}): {r['backend']} "
                    f"{r['configuration']} on {r['link']}"
                )
                out[(what, why)] = out.get((what, why), 0) + 1
    return [
        f"{what}: {n} run{'s' if n > 1 else ''} failed — {why}" for (what, why), n in out.items()
    ]
