"""The encoding between the checker and the program's process (``wire.py``): plain values
round-trip as builtins, whatever their class said; anything else is refused or kept as a
reference; bytes that are not a value are refused within bounds."""

from __future__ import annotations

import collections
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from arbiter.services.sandbox.injail.wire import WIRE_DEPTH, WireError, wire_pack, wire_unpack


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(10**400),
        1.5,
        float("inf"),
        -0.0,
        2 - 3j,
        "π ≠ 3 \ud800",
        b"\x00\xff",
        bytearray(b"ab"),
        [1, [2, (3, {4})]],
        {"a": frozenset({1}), (1, 2): None},
        range(1, 10, 3),
        Fraction(1, 3),
        Decimal("1.10"),
    ],
)
def test_plain_values_round_trip(value: Any) -> None:
    back = wire_unpack(wire_pack(value))
    assert type(back) is type(value) and repr(back) == repr(value)


def test_subclasses_cross_as_their_base_type() -> None:
    class Yes(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    class Mine(dict):
        def __eq__(self, other: object) -> bool:
            return True

    back = wire_unpack(wire_pack([Yes(7), Mine(a=2), collections.Counter("aab")]))
    assert back == [7, {"a": 2}, {"a": 2, "b": 1}]
    assert type(back[0]) is int and type(back[1]) is dict
    assert back[0] != 8 and back[1] != {}  # the builtin's own ==, not the program's
    assert type(back[2]) is collections.Counter  # its methods (most_common) are the tests'
    assert back[2].most_common(1) == [("a", 2)]


def test_iterators_cross_as_their_items_and_other_objects_as_references() -> None:
    back = wire_unpack(wire_pack(x * x for x in range(3)))
    assert list(back) == [0, 1, 4]
    kept: list[object] = []

    def other(obj: object) -> tuple[str, str]:
        kept.append(obj)
        return "r", f"{len(kept)} {type(obj).__name__}"

    data = wire_pack([object()], other)
    with pytest.raises(WireError):
        wire_unpack(data)  # no reference hook: a reference is no value
    assert wire_unpack(data, lambda kind, key: (kind, key)) == [("r", "1 object")]
    with pytest.raises(WireError):
        wire_pack(object())


@pytest.mark.parametrize(
    "data",
    [b"", b"?", b"i\x00\x00\x00\x09\x01", b"l\xff\xff\xff\xff", b"NN", b"d\x00\x00\x00\x01lN"],
)
def test_bytes_that_are_not_a_value_are_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        wire_unpack(data)


def test_nesting_is_bounded_both_ways() -> None:
    deep: list[Any] = []
    for _ in range(WIRE_DEPTH + 5):
        deep = [deep]
    with pytest.raises(WireError):
        wire_pack(deep)
    with pytest.raises(WireError):
        wire_unpack(b"l\x00\x00\x00\x01" * (WIRE_DEPTH + 5) + b"N")


def test_keys_of_one_hash_are_refused_before_a_quadratic_build() -> None:
    colliding = [i * ((1 << 61) - 1) for i in range(1, 5000)]  # every one hashes to 0
    for value in (set(colliding), frozenset(colliding), dict.fromkeys(colliding, 0)):
        with pytest.raises(WireError, match="hash values"):
            wire_unpack(wire_pack(value))
    spread = set(range(100_000))
    assert wire_unpack(wire_pack(spread)) == spread


def test_a_fraction_too_large_to_normalise_is_refused() -> None:
    assert wire_unpack(wire_pack(Fraction(3, 1 << 1000))) == Fraction(3, 1 << 1000)
    huge = Fraction((1 << 200_000) + 1, 3)
    with pytest.raises(WireError, match="Fraction"):
        wire_unpack(wire_pack(huge))


def test_many_namedtuples_of_one_kind_share_one_class() -> None:
    Point = collections.namedtuple("Point", "x y")
    got = wire_unpack(wire_pack([Point(i, i) for i in range(3)]))
    assert got == [(0, 0), (1, 1), (2, 2)] and got[0].x == 0
    assert len({type(p) for p in got}) == 1
