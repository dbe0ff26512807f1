"""The results store: one SQLite database per lab directory (`LAB/results.sqlite`).

campaigns   one `ipsec-lab run` of a scenario: its full text, environment, status
runs        one (backend, configuration, link, workload, repetition) of a campaign:
            done / skipped (with the reason) / failed (with the error); committed the
            moment it ends, so an interrupted campaign keeps every finished run
results     the measurements of a run (one per file size for HTTP/SMTP), metrics as JSON
trials      each trial of an RFC 2544 search
samples     the CPU time series of each measurement

`--resume` continues the newest unfinished campaign of the same scenario text and
repeats no run that is done or skipped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS campaigns (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  scenario_path TEXT NOT NULL,
  scenario_text TEXT NOT NULL,
  started REAL NOT NULL,
  finished REAL,
  status TEXT NOT NULL DEFAULT 'running',
  environment TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY,
  campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
  backend TEXT NOT NULL,
  configuration TEXT NOT NULL,
  link TEXT NOT NULL,
  workload TEXT NOT NULL,
  flow TEXT NOT NULL,
  repetition INTEGER NOT NULL,
  status TEXT NOT NULL,
  reason TEXT,
  backend_version TEXT,
  started REAL NOT NULL,
  finished REAL NOT NULL,
  UNIQUE (campaign_id, backend, configuration, link, workload, flow, repetition)
);
CREATE TABLE IF NOT EXISTS results (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  label TEXT NOT NULL,
  metrics TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
  result_id INTEGER NOT NULL REFERENCES results(id),
  idx INTEGER NOT NULL,
  offered_mbps REAL,
  loss_pct REAL,
  passed INTEGER,
  data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
  result_id INTEGER NOT NULL REFERENCES results(id),
  t REAL NOT NULL,
  user REAL, system REAL, softirq REAL, idle REAL
);
"""


@dataclass(frozen=True)
class RunKey:
    backend: str
    configuration: str
    link: str
    workload: str
    flow: str
    repetition: int


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        if os.environ.get("IPSEC_LAB_VM"):
            # In `--vm` the lab directory is the host's, shared over 9p, which has neither
            # the shared memory WAL needs nor POSIX locks: a rollback journal and no
            # locking (the host does not touch the store while the VM runs).
            self.db = sqlite3.connect(f"file:{path}?vfs=unix-none", uri=True)
            self.db.execute("PRAGMA journal_mode=DELETE")
        else:
            self.db = sqlite3.connect(path)
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.row_factory = sqlite3.Row
        self.db.executescript(SCHEMA)
        self.db.commit()

    def close(self) -> None:
        self.db.close()

    # --- campaigns ---------------------------------------------------------------------

    def new_campaign(self, name: str, path: str, text: str, env: dict[str, Any]) -> int:
        cur = self.db.execute(
            "INSERT INTO campaigns (name, scenario_path, scenario_text, started, environment)"
            " VALUES (?, ?, ?, ?, ?)",
            (name, path, text, time.time(), json.dumps(env)),
        )
        self.db.commit()
        assert cur.lastrowid is not None
        return cur.lastrowid

    def resumable(self, text: str, same: Callable[[str], bool] | None = None) -> int | None:
        """The newest unfinished campaign of this scenario: of exactly this text, or one
        `same` says is the same scenario (parsed alike: a comment or a key's order may
        differ), if any."""
        return self._newest(text, False, same)

    def finished_with(
        self,
        text: str,
        same: Callable[[str], bool] | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> int | None:
        """The newest finished campaign of this scenario (as `resumable` matches), if any;
        with `where`, the newest whose stored environment it accepts."""
        return self._newest(text, True, same, where)

    def _newest(self, text: str, finished: bool, same: Callable[[str], bool] | None,
                where: Callable[[dict[str, Any]], bool] | None = None) -> int | None:  # fmt: skip
        rows = self.db.execute(
            "SELECT id, scenario_text, environment FROM campaigns WHERE (status = 'finished') = ?"
            " ORDER BY id DESC",
            (finished,),
        ).fetchall()
        for row in rows:
            if row["scenario_text"] == text or (same and same(row["scenario_text"])):
                if where is None or where(json.loads(row["environment"] or "{}")):
                    return int(row["id"])
        return None

    def add_environment(self, campaign: int, more: dict[str, Any]) -> None:
        """Add what the campaign learnt of its machines while running (the real hosts'
        kernels and NICs) to its stored environment."""
        row = self.db.execute("SELECT environment FROM campaigns WHERE id = ?",
                              (campaign,)).fetchone()  # fmt: skip
        env = json.loads(row[0]) if row else {}
        env.update(more)
        self.db.execute("UPDATE campaigns SET environment = ? WHERE id = ?",
                        (json.dumps(env), campaign))  # fmt: skip
        self.db.commit()

    def set_status(self, campaign: int, status: str) -> None:
        self.db.execute(
            "UPDATE campaigns SET status = ?, finished = ? WHERE id = ?",
            (status, time.time() if status == "finished" else None, campaign),
        )
        self.db.commit()

    def campaigns(self) -> list[sqlite3.Row]:
        return self.db.execute(
            "SELECT c.*, (SELECT COUNT(*) FROM runs r WHERE r.campaign_id = c.id) AS n_runs,"
            " (SELECT COUNT(*) FROM runs r WHERE r.campaign_id = c.id AND r.status = 'done')"
            " AS n_done,"
            " (SELECT COUNT(*) FROM runs r WHERE r.campaign_id = c.id AND r.status = 'failed')"
            " AS n_failed,"
            " (SELECT COUNT(*) FROM runs r WHERE r.campaign_id = c.id AND r.status = 'skipped')"
            " AS n_skipped FROM campaigns c ORDER BY c.id"
        ).fetchall()

    def campaign(self, campaign: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute(
            "SELECT * FROM campaigns WHERE id = ?", (campaign,)
        ).fetchone()
        return row

    # --- runs ----------------------------------------------------------------------------

    def finished_keys(self, campaign: int) -> set[RunKey]:
        rows = self.db.execute(
            "SELECT backend, configuration, link, workload, flow, repetition FROM runs"
            " WHERE campaign_id = ? AND status IN ('done', 'skipped')",
            (campaign,),
        ).fetchall()
        return {RunKey(*tuple(r)) for r in rows}

    def record(
        self,
        campaign: int,
        key: RunKey,
        status: str,
        started: float,
        reason: str | None = None,
        version: str | None = None,
        results: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> int:
        """Write one run and its results in one transaction, committed at once."""
        with self.db:
            self.db.execute(
                "DELETE FROM runs WHERE campaign_id = ? AND backend = ? AND configuration = ?"
                " AND link = ? AND workload = ? AND flow = ? AND repetition = ?"
                " AND status = 'failed'",
                (campaign, *_key(key)),
            )
            cur = self.db.execute(
                "INSERT INTO runs (campaign_id, backend, configuration, link, workload, flow,"
                " repetition, status, reason, backend_version, started, finished)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (campaign, *_key(key), status, reason, version, started, time.time()),
            )
            run_id = cur.lastrowid
            assert run_id is not None
            for label, metrics in results:
                trials = metrics.get("trials") or []
                series = metrics.get("cpu_series") or []
                slim = {k: v for k, v in metrics.items() if k not in ("trials", "cpu_series")}
                rc = self.db.execute(
                    "INSERT INTO results (run_id, label, metrics) VALUES (?, ?, ?)",
                    (run_id, label, json.dumps(slim)),
                )
                rid = rc.lastrowid
                self.db.executemany(
                    "INSERT INTO trials VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (rid, i, t.get("offered_mbps"), t.get("loss_pct"), t.get("passed"),
                         json.dumps(t))
                        for i, t in enumerate(trials)
                    ],
                )  # fmt: skip
                self.db.executemany(
                    "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (rid, x["t"], x["user"], x["system"], x["softirq"], x["idle"])
                        for x in series
                    ],
                )
        return run_id

    def runs(self, campaign: int, samples: bool = False) -> list[dict[str, Any]]:
        """Every run of a campaign with its results (metrics decoded), in run order;
        with `samples`, each result's CPU time series as `cpu_series` too."""
        out = []
        for r in self.db.execute(
            "SELECT * FROM runs WHERE campaign_id = ? ORDER BY id", (campaign,)
        ).fetchall():
            d = dict(r)
            d["results"] = []
            for x in self.db.execute(
                "SELECT id, label, metrics FROM results WHERE run_id = ? ORDER BY id", (r["id"],)
            ).fetchall():
                res = {"label": x["label"], **json.loads(x["metrics"])}
                if samples:
                    res["cpu_series"] = [
                        dict(s)
                        for s in self.db.execute(
                            "SELECT t, user, system, softirq, idle FROM samples"
                            " WHERE result_id = ? ORDER BY t",
                            (x["id"],),
                        )
                    ]
                d["results"].append(res)
            out.append(d)
        return out

    def campaigns_with_none(self, key: str, before: float, other_than: int) -> list[int]:
        """Campaigns started before `before` (newest first), not `other_than`, with a
        done `none` run whose result carries testbed key `key` (`ceiling.testbed_key`)."""
        rows = self.db.execute(
            "SELECT DISTINCT c.id, c.started FROM campaigns c JOIN runs r ON r.campaign_id = c.id"
            " JOIN results x ON x.run_id = r.id WHERE r.backend = 'none' AND r.status = 'done'"
            " AND c.id != ? AND c.started < ? AND json_extract(x.metrics, '$.testbed_key') = ?"
            " ORDER BY c.started DESC, c.id DESC",
            (other_than, before, key),
        ).fetchall()
        return [int(r["id"]) for r in rows]

    def trials(self, run_id: int) -> list[dict[str, Any]]:
        return [
            json.loads(r["data"])
            for r in self.db.execute(
                "SELECT t.data FROM trials t JOIN results x ON x.id = t.result_id"
                " WHERE x.run_id = ? ORDER BY t.result_id, t.idx",
                (run_id,),
            )
        ]


ResultKey = tuple[str, str, str, str, str]  # backend, configuration, link, flow, label


def group_results(runs: list[dict[str, Any]]) -> dict[ResultKey, list[dict[str, Any]]]:
    """The measurements of finished runs (as `Store.runs` gives them), grouped by
    (backend, configuration, link, flow, label): a group's members are repetitions."""
    out: dict[ResultKey, list[dict[str, Any]]] = {}
    for r in runs:
        if r["status"] != "done":
            continue
        for x in r["results"]:
            key = (r["backend"], r["configuration"], r["link"], r["flow"], x["label"])
            out.setdefault(key, []).append(x)
    return out


def _key(k: RunKey) -> tuple[str, str, str, str, str, int]:
    return (k.backend, k.configuration, k.link, k.workload, k.flow, k.repetition)
