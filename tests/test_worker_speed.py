"""The worker's fast paths give the same answers as the plain ones.

One JSON decode per leased batch (orjson when ``pgqueue[speed]`` installed
it), array literals for the completer's acks, the event loop choice and the
garbage-collector tuning of a running worker. No database needed: these are
pure functions; the worker tests run the same paths against PostgreSQL.
"""

from __future__ import annotations

import gc
import json

import pytest

from pgqueue import payloads
from pgqueue.errors import InvalidOption
from pgqueue.ops.consume import _bigint_array, _null_array
from pgqueue.payloads import UndecodableJson, loads_many, loads_stored
from pgqueue.worker.runner import loop_factory, tuned_gc
from pgqueue.worker.settings import GC_THRESHOLD, WorkerSettings

TEXTS = [
    b"{}",
    b'{"a": 1, "b": [1, 2.5, -0.0, 1e-07, 1E+300], "c": null, "d": true}',
    b'{"big": 123456789012345678901234567890, "neg": -9223372036854775809}',
    b'{"edge": 18446744073709551615, "s": "caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\"}',
    '{"unicode": "\u00e9\u4e2d"}'.encode(),
    None,
    b'[[[[[[[[[[{"x": [1]}]]]]]]]]]]',
    b'"just a string"',
    b"12",
]


@pytest.mark.parametrize("use_orjson", [True, False])
def test_loads_many_equals_json_one_by_one(
    monkeypatch: pytest.MonkeyPatch, use_orjson: bool
) -> None:
    if use_orjson:
        pytest.importorskip("orjson")
    monkeypatch.setenv("PGQUEUE_NO_ORJSON", "0" if use_orjson else "1")
    monkeypatch.setattr(payloads, "_orjson_module", False)  # look it up again
    assert (payloads.orjson() is not None) == use_orjson
    got = loads_many(list(TEXTS))
    want = [None if t is None else json.loads(t) for t in TEXTS]
    assert got == want
    # Same types too (orjson would read the huge integers as floats).
    assert [type(v) for v in got] == [type(v) for v in want]
    assert type(got[2]["big"]) is int
    assert type(got[2]["neg"]) is int
    assert loads_many([]) == []
    # The lease reads jsonb as text (str): the same values, the same types.
    as_text = loads_many([None if t is None else t.decode() for t in TEXTS])
    assert as_text == want
    assert [type(v) for v in as_text] == [type(v) for v in want]
    assert loads_many([None, None]) == [None, None]


def test_loads_many_too_deep_spoils_only_its_own_job() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    got = loads_many([b'{"a": 1}', deep, b"{}"])
    assert got[0] == {"a": 1}
    assert got[2] == {}
    assert isinstance(got[1], UndecodableJson)
    assert isinstance(loads_stored(deep), UndecodableJson)
    got = loads_many(['{"a": 1}', deep.decode(), "{}"])
    assert got[0] == {"a": 1}
    assert got[2] == {}
    assert isinstance(got[1], UndecodableJson)


def test_ack_arrays_are_postgres_literals() -> None:
    assert _bigint_array([1, 2, 9223372036854775807]) == "{1,2,9223372036854775807}"
    assert _bigint_array([]) == []
    # Anything but plain ints goes to psycopg's dumper (and its errors).
    assert _bigint_array([1, True]) == [1, True]
    assert _bigint_array([1, "2"]) == [1, "2"]
    assert _null_array(3) == "{NULL,NULL,NULL}"


def test_event_loop_choice() -> None:
    assert loop_factory("asyncio") is None
    try:
        import uvloop
    except ImportError:
        assert loop_factory("auto") is None
        with pytest.raises(InvalidOption, match="pgqueue\\[speed\\]"):
            loop_factory("uvloop")
    else:
        assert loop_factory("auto") is uvloop.new_event_loop
        assert loop_factory("uvloop") is uvloop.new_event_loop
    with pytest.raises(InvalidOption, match="event_loop must be one of"):
        WorkerSettings.build(event_loop="trio")
    assert WorkerSettings.build(event_loop="asyncio").event_loop == "asyncio"


def test_tuned_gc_restores_and_nests() -> None:
    before = gc.get_threshold()
    with tuned_gc():
        assert gc.get_threshold()[0] == max(before[0], GC_THRESHOLD)
        assert gc.get_freeze_count() > 0
        with tuned_gc():  # a second worker in the same process
            assert gc.get_threshold()[0] == max(before[0], GC_THRESHOLD)
        assert gc.get_threshold()[0] == max(before[0], GC_THRESHOLD)  # still tuned
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    with tuned_gc(enabled=False):
        assert gc.get_threshold() == before
