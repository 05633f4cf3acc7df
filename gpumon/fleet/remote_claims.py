"""Who holds a host's cards, from its snapshot document: each card's `claims` and `reservation`,
as `snapshot --json` (and the stream) prints them. Untrusted like the rest of the document
(fleet/schema.py): bounded, made printable, a wrong type refused with SchemaError."""

from __future__ import annotations

from typing import Any

from gpumon.fleet.schema import MAX_CARDS, SchemaError
from gpumon.sanitize import printable

MAX_WORD = 64  # a user's or a job's name, as shown


def taken_from_remote(doc: dict[str, Any]) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """Each card claimed or reserved by someone else (its ref, who, in words), and the cards the
    user reserved; nothing from a gpumon that does not say (older ones). `doc` has passed
    snapshot_from_remote."""
    taken: list[tuple[str, str]] = []
    mine: set[str] = set()
    for i, gpu in enumerate(doc.get("gpus") or []):
        ref = gpu.get("uuid") if isinstance(gpu, dict) else None
        if not isinstance(ref, str) or not ref:
            continue
        listed = gpu.get("claims") or []
        if not isinstance(listed, list) or len(listed) > MAX_CARDS:
            raise SchemaError(f"gpus[{i}].claims is not a list of at most {MAX_CARDS} claims")
        words = [_claimed(c) for c in listed if isinstance(c, dict)]
        booked = gpu.get("reservation")
        if isinstance(booked, dict):
            if booked.get("mine") is True:
                mine.add(printable(ref))
            else:
                words.append(f"reserved by {_word(booked.get('user')) or '?'}")
        if words:
            taken.append((printable(ref), "; ".join(words)))
    return tuple(taken), frozenset(mine)


def _claimed(claim: dict[str, Any]) -> str:
    name = _word(claim.get("name"))
    return f"claimed by {_word(claim.get('user')) or '?'}" + (f": job {name}" if name else "")


def _word(value: Any) -> str:
    return printable(value[:MAX_WORD]) if isinstance(value, str) else ""
