"""The grammar of the commands that share a host's cards: `queue`, `reserve`, `release`
(parser.py hands over its option helpers, so this module never imports it back)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def add_sharing_commands(sub: Any, duration: Callable[[str], float], add_config: Callable[..., None],
                         add_timeout: Callable[..., None], add_source: Callable[..., None],
                         add_fleet: Callable[..., None]) -> None:
    p = sub.add_parser("queue", help="the host's queue of jobs waiting for cards (run --wait), every user's")
    p.add_argument("--json", action="store_true", help="as JSON, next to start first")
    add_config(p, suppress=True)
    add_fleet(p, suppress=True)
    p.set_defaults(subcommand="queue")

    p = sub.add_parser("reserve", help="book cards for a while: others' auto placement, select and queue skip them")
    p.add_argument("--gpu", metavar="N[,M...]", help="the cards: indices, UUIDs or PCI bus ids")
    p.add_argument("--for", dest="duration", type=duration, metavar="DURATION", help="how long: 30m, 2h, 1d")
    p.add_argument("--note", metavar="TEXT", help="what for, shown beside the reservation")
    p.add_argument("--list", action="store_true", help="list the host's reservations")
    p.add_argument("--json", action="store_true", help="with --list: as JSON")
    add_timeout(p)
    add_source(p, suppress=True, replay=False)
    add_fleet(p, suppress=True)
    p.set_defaults(subcommand="reserve")

    p = sub.add_parser("release", help="end your reservations (all, or those of --gpu)")
    p.add_argument("--gpu", metavar="N[,M...]", help="only these cards")
    add_timeout(p)
    add_source(p, suppress=True, replay=False)
    add_fleet(p, suppress=True)
    p.set_defaults(subcommand="release")
