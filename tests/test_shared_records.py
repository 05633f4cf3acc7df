"""One reader of the shared place's records: claims, the queue and reservations read a record's
name and its (other users') content the same way, bounded the same way."""

from __future__ import annotations

import os
import time

from gpumon.sharing import claims, queue, reservations
from gpumon.sharing.records import MAX_TEXT, create, name_parts, record_name

ODD = {"job": "j" * 500, "name": 12345, "host": {"not": "text"}, "gpu_spec": 1.5, "pid": True, "since": False,
       "note": ["a list"], "index": True}


def test_a_records_name_reads_back_its_parts_made_safe(tmp_path):
    name = record_name("claim", "00000000:07:00.0", "job/1.2")
    assert name == "claim.00000000_07_00_0.job_1_2"
    fd, path = create(tmp_path, name, {})
    os.close(fd)
    assert name_parts(path) == ["00000000_07_00_0", "job_1_2"]


def test_odd_content_reads_the_same_as_a_claim_an_entry_and_a_reservation(tmp_path):
    card = "GPU-" + "e" * 36
    held = [create(tmp_path, record_name(claims.PREFIX, card, "j"), ODD | {"card": card})[0],
            create(tmp_path, record_name(queue.PREFIX, "j"), ODD)[0]]
    now = time.time()
    os.close(create(tmp_path, record_name(reservations.PREFIX, card), ODD | {
        "card": card, "until": now + 3600, "created": now}, locked=False)[0])
    try:
        (claim,) = claims.read(tmp_path)[card]
        (entry,) = queue.read(tmp_path, supervised=False)
        booked = reservations.read(tmp_path, now=now)[card]
    finally:
        for fd in held:
            os.close(fd)
    assert claim.job == entry.job == "j" * MAX_TEXT  # cut, in every kind
    assert claim.name == entry.name == "12345"  # a number as written
    assert claim.host == entry.host == booked.host == ""  # not text: nothing
    assert entry.gpu_spec == "1.5" and booked.note == ""
    assert claim.pid is None and claim.since is None and booked.index is None  # true is not a number


def test_a_card_too_long_to_be_one_is_no_record(tmp_path):
    card = "GPU-" + "e" * 200
    fd = create(tmp_path, record_name(claims.PREFIX, card, "j"), {"card": card, "job": "j"})[0]
    os.close(create(tmp_path, record_name(reservations.PREFIX, card), {
        "card": card, "until": time.time() + 60, "created": time.time()}, locked=False)[0])
    try:
        assert claims.read(tmp_path) == {} and reservations.read(tmp_path) == {}
    finally:
        os.close(fd)
