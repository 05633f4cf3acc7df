"""A recorded history for the ledger's tests, made the same every time: three days of one host's
three cards, held by Slurm jobs of three users (runs of 3 to 7 hours, gaps of up to 2), some of them
idle, some with SM unknown, written as gpumon 0.x's first ledger format (`PRAGMA user_version` 1,
the tables docs/design.md described), so that upgrading it in place and the answers before and
after can be compared. tests/data/usage_v1_answers.json holds what `gpumon report --json` of the
format-1 code (commit a3d11de) answered on it, TZ=UTC."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

START = 1_767_225_600  # 2026-01-01 00:00 UTC
DAYS = 3
HOST = "labhost"
CARDS = [f"GPU-5a1e{n:04x}-0000-4000-8000-00000000000{n}" for n in range(3)]
USERS = ("alice", "bob", "carol")

V1_SCHEMA = """
CREATE TABLE holder_minutes (
  minute INTEGER NOT NULL, host TEXT NOT NULL, card TEXT NOT NULL, kind TEXT NOT NULL, holder TEXT NOT NULL,
  card_index INTEGER NOT NULL, label TEXT NOT NULL, user TEXT,
  held_s REAL NOT NULL, sm_s REAL NOT NULL, sm_known_s REAL NOT NULL, mem_s REAL NOT NULL, mem_peak INTEGER,
  energy_j REAL NOT NULL, idle_s REAL NOT NULL,
  PRIMARY KEY (minute, host, card, kind, holder)) WITHOUT ROWID;
CREATE TABLE card_minutes (
  minute INTEGER NOT NULL, host TEXT NOT NULL, card TEXT NOT NULL, card_index INTEGER NOT NULL, name TEXT NOT NULL,
  seen_s REAL NOT NULL, util_s REAL NOT NULL, util_known_s REAL NOT NULL, energy_j REAL NOT NULL,
  held_s REAL NOT NULL, busy_s REAL NOT NULL,
  PRIMARY KEY (minute, host, card)) WITHOUT ROWID;
PRAGMA user_version = 1;
"""

# Windows the answers were asked for: the whole history, a day on hour boundaries, the last 5 hours.
WINDOWS = ((START - 3600, START + DAYS * 86400 + 3600), (START + 86400, START + 2 * 86400),
           (START + DAYS * 86400 - 5 * 3600, START + DAYS * 86400))


def history_rows() -> tuple[list[tuple], list[tuple]]:
    """The holder rows and card rows, in the format-1 tables' column order."""
    rng = random.Random(52)
    holders, cards = [], []
    for index, card in enumerate(CARDS):
        t = START + rng.randrange(0, 7200, 60)
        job = 4000 + index * 100
        while t < START + DAYS * 86400:
            length = rng.randrange(3 * 3600, 7 * 3600, 60)
            user = rng.choice(USERS)
            job += 1
            sm = rng.choice((0, 35, 80, 95, None))
            memory = rng.randrange(1, 80) * 2 ** 30
            for minute in range(t, min(t + length, START + DAYS * 86400), 60):
                held = 60.0 if rng.random() > 0.02 else float(rng.randrange(1, 60))
                power = rng.uniform(80, 400)
                known = held if sm is not None else 0.0
                parts = (held, (sm or 0) * known, known, memory * held, memory, power * held,
                         held if sm == 0 else 0.0)
                holders.append((minute, HOST, card, "user", user, index, user, user, *parts))
                holders.append((minute, HOST, card, "slurm", str(job), index, f"job {job}", user, *parts))
                cards.append((minute, HOST, card, index, "NVIDIA A100-SXM4-80GB", 60.0, (sm or 0) * 60.0, 60.0,
                               power * 60.0, held, 60.0 if sm else 0.0))
            gap = rng.randrange(0, 2 * 3600, 60)
            for minute in range(t + length, min(t + length + gap, START + DAYS * 86400), 60):
                cards.append((minute, HOST, card, index, "NVIDIA A100-SXM4-80GB", 60.0, 0.0, 60.0, 60.0 * 60, 0.0, 0.0))
            t += length + gap
    return holders, cards


def write_v1_ledger(path: Path) -> Path:
    holders, cards = history_rows()
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    with conn:
        conn.executemany(f"INSERT INTO holder_minutes VALUES ({', '.join('?' * 15)})", holders)
        conn.executemany(f"INSERT INTO card_minutes VALUES ({', '.join('?' * 11)})", cards)
    conn.close()
    return path
