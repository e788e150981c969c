"""kprod's exactly-once state in Kafka (spark/exactly_once_state.py): what each earlier
release wrote is read the same today (golden bytes, each from the commit that wrote it in
main's history), what this one writes is pinned, every value round-trips, a newer format
is refused by name and anything else is "not ours". Pure: no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.spark.exactly_once_state import DirectoryRecord, Marker, RegistryEntry, StateFormatError

DIGEST = "3:00000000000000ff"

# (the metadata as that release committed it, what it means)
MARKERS = [
    # 5803600 (the first exactly-once sink): the query and the task count
    ('{"query":"q","tasks":2}', Marker("q", 2)),
    # cae08e4 to 24d507d: and how many tasks had a transaction
    ('{"query":"q","tasks":2,"txns":1}', Marker("q", 2, 1)),
    # d459ac5 on: a named batch write, which has no query
    ('{"query":null,"tasks":2,"txns":2}', Marker(None, 2, 2)),
    # 24d507d to 0e565f5: and the task's rows digest, where the task reported one
    (f'{{"query":"q","tasks":2,"txns":1,"rows":"{DIGEST}"}}', Marker("q", 2, 1, DIGEST)),
    # this release: the format's version first
    (f'{{"v":4,"query":"q","tasks":2,"txns":1,"rows":"{DIGEST}"}}', Marker("q", 2, 1, DIGEST)),
]
DIRECTORY = [
    # cae08e4 to 395ed9d (json.dumps' default separators): the query and the ids used
    ('{"query": "q", "ids": 3}', DirectoryRecord("q", 3)),
    ('{"query": null, "ids": 3}', DirectoryRecord(None, 3)),
    # 395ed9d: and when its markers began to be written
    ('{"query": "q", "ids": 3, "at": 1764300000000}', DirectoryRecord("q", 3, 1764300000000)),
    # 57e6173 to 0e565f5: and, once every EndTxn succeeded, that the commit ended whole
    ('{"query": "q", "ids": 3, "at": 1764300000000, "done": true}', DirectoryRecord("q", 3, 1764300000000, True)),
    # this release
    ('{"v":4,"query":"q","ids":3,"at":1764300000000,"done":true}', DirectoryRecord("q", 3, 1764300000000, True)),
]
# 76231cf to this release: the prefix itself
REGISTRY = [("kprod-0123456789abcdef0123", RegistryEntry("kprod-0123456789abcdef0123"))]


@pytest.mark.parametrize(("text", "value"), MARKERS)
def test_markers_of_every_release_are_read(text: str, value: Marker) -> None:
    assert Marker.decode(text) == value


@pytest.mark.parametrize(("text", "value"), DIRECTORY)
def test_directory_records_of_every_release_are_read(text: str, value: DirectoryRecord) -> None:
    assert DirectoryRecord.decode(text) == value


@pytest.mark.parametrize(("text", "value"), REGISTRY)
def test_registry_entries_of_every_release_are_read(text: str, value: RegistryEntry) -> None:
    assert RegistryEntry.decode(text) == value


def test_this_release_writes_these_bytes() -> None:
    assert MARKERS[-1][1].encode() == MARKERS[-1][0]
    assert DIRECTORY[-1][1].encode() == DIRECTORY[-1][0]
    assert REGISTRY[-1][1].encode() == REGISTRY[-1][0]
    assert Marker("q", 2, 1).encode() == '{"v":4,"query":"q","tasks":2,"txns":1}'
    assert DirectoryRecord("q", 3, 5).encode() == '{"v":4,"query":"q","ids":3,"at":5}'


@pytest.mark.parametrize("text", [None, "", "not json", "[1]", "3", '{"query":"q"}', '{"query":"q","tasks":"2"}',
                                  '{"query":1,"tasks":2}', '{"query":"q","tasks":true}',
                                  '{"query":"q","tasks":2,"txns":1.5}', '{"query":"q","tasks":2,"rows":7}',
                                  '{"v":"4","query":"q","tasks":2}'])
def test_what_is_not_a_marker_is_none(text: str | None) -> None:
    assert Marker.decode(text) is None


@pytest.mark.parametrize("text", [None, "", "{", '{"query":"q"}', '{"query":"q","ids":"3"}', '{"query":2,"ids":3}'])
def test_what_is_not_a_directory_record_is_none(text: str | None) -> None:
    assert DirectoryRecord.decode(text) is None


def test_a_newer_format_is_refused_by_name() -> None:
    with pytest.raises(StateFormatError, match="marker .* newer kprod \\(format 5; this one reads up to 4\\)"):
        Marker.decode('{"v":5,"query":"q","tasks":2}')
    with pytest.raises(StateFormatError, match="directory record"):
        DirectoryRecord.decode('{"v":5,"query":"q","ids":3}')
    with pytest.raises(StateFormatError, match="registry entry"):
        RegistryEntry.decode('{"v":2,"prefix":"p"}')


_texts = st.text(max_size=30)
_counts = st.integers(min_value=0, max_value=2**31 - 1)


@given(st.builds(Marker, st.none() | _texts, _counts, st.none() | _counts, st.none() | _texts))
def test_markers_round_trip(marker: Marker) -> None:
    assert Marker.decode(marker.encode()) == marker


@given(st.builds(DirectoryRecord, st.none() | _texts, _counts, st.none() | st.integers(0, 2**53), st.booleans()))
def test_directory_records_round_trip(record: DirectoryRecord) -> None:
    assert DirectoryRecord.decode(record.encode()) == record


@given(_texts.filter(lambda s: s and not s.startswith("{")))
def test_registry_entries_round_trip(prefix: str) -> None:
    assert RegistryEntry.decode(RegistryEntry(prefix).encode()) == RegistryEntry(prefix)
