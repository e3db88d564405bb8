"""Plain values between the checker and the program's process, in the sandbox (``bwrap.py``
joins this file to the harness).

Only builtin values cross: None, bool, int, float, complex, str, bytes, bytearray, list,
tuple, dict, set, frozenset, range, ``fractions.Fraction`` and ``decimal.Decimal``
(rebuilt from their numbers), ``collections.OrderedDict`` and namedtuples (rebuilt as
such). Another subclass crosses as its base type (a ``Counter`` as a dict): whatever its
methods say, the checker gets the builtin value, whose ``==`` no program defines. Any
other object, an iterator included, stays in the program's process and crosses as a
reference to it (``other``/``ref`` hooks), which the checker can only hand back, call, read
or ask about, never compare; without that hook (what the tests send) an iterator crosses
as the list of its first ``WIRE_ITEMS`` items and arrives as an iterator over them.

The encoding is ours, bounded on both sides (size, depth); never pickle or marshal, which
would read code from the program's bytes. A frame is a 4-byte length and the encoding.
"""

from __future__ import annotations

import os
import struct as _wire_struct
import sys

WIRE_MAX = 8 << 20  # bytes in one frame
WIRE_DEPTH = 100  # nesting of containers
WIRE_ITEMS = 100_000  # items taken from an iterator
WIRE_COLLIDING = 4_000_000  # sum over hash values of (keys with it)²: a set's building work
WIRE_FRACTION_BITS = 100_000  # a Fraction's numerator or denominator (gcd is quadratic)
_WIRE_TUPLES: dict = {}  # namedtuple classes by (name, fields): one per kind, not per value
_WIRE_F = _wire_struct.Struct("<d")


class WireError(Exception):
    """A value that cannot cross (too large, too deep, not plain), or bytes that are not a
    value."""


def wire_pack(value, other=None):
    out: list[bytes] = []
    _wire_put(value, out, other, 0)
    data = b"".join(out)
    if len(data) > WIRE_MAX:
        raise WireError(f"the value takes more than {WIRE_MAX >> 20} MB")
    return data


def _wire_len(n):
    return n.to_bytes(4, "big")


def _wire_int(n, out):
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    out += [_wire_len(len(raw)), raw]


def _wire_put(v, out, other, depth):
    if depth > WIRE_DEPTH:
        raise WireError("the value is nested too deeply")
    if v is None or v is True or v is False:
        out.append({None: b"N", True: b"T", False: b"F"}[v])
    elif isinstance(v, int):
        out.append(b"i")
        _wire_int(int.__index__(v), out)
    elif isinstance(v, float):
        out += [b"f", _WIRE_F.pack(float.__float__(v))]
    elif isinstance(v, complex):
        out += [b"c", _WIRE_F.pack(complex.real.__get__(v)), _WIRE_F.pack(complex.imag.__get__(v))]
    elif isinstance(v, str):
        raw = str.encode(v, "utf-8", "surrogatepass")
        out += [b"s", _wire_len(len(raw)), raw]
    elif isinstance(v, bytes | bytearray):
        raw = bytes(v)
        out += [b"b" if isinstance(v, bytes) else b"y", _wire_len(len(raw)), raw]
    elif _wire_number(v, "collections", "OrderedDict") or _wire_number(
        v, "collections", "Counter"
    ):  # an OrderedDict's == minds the order; a Counter has its own methods
        out += [b"O" if _wire_number(v, "collections", "OrderedDict") else b"C"]
        out.append(_wire_len(len(v)))
        for key, item in list(dict.items(v)):
            _wire_put(key, out, other, depth + 1)
            _wire_put(item, out, other, depth + 1)
    elif isinstance(v, tuple) and isinstance(_wire_fields(v), tuple):
        fields = [str(f) for f in _wire_fields(v)]  # a namedtuple: by name too
        out.append(b"P")
        _wire_put([type(v).__name__, fields, list(tuple.__iter__(v))], out, other, depth + 1)
    elif isinstance(v, dict):
        items = list(dict.items(v))
        out += [b"d", _wire_len(len(items))]
        for key, item in items:
            _wire_put(key, out, other, depth + 1)
            _wire_put(item, out, other, depth + 1)
    elif isinstance(v, list | tuple | set | frozenset):
        tag = b"l" if isinstance(v, list) else b"t" if isinstance(v, tuple) else b"S"
        tag = b"Z" if isinstance(v, frozenset) else tag
        items = list(v)
        out += [tag, _wire_len(len(items))]
        for item in items:
            _wire_put(item, out, other, depth + 1)
    elif type(v) is range:
        out.append(b"R")
        for n in (v.start, v.stop, v.step):
            _wire_int(n, out)
    elif _wire_number(v, "fractions", "Fraction"):
        out.append(b"Q")
        _wire_int(int(v.numerator), out)
        _wire_int(int(v.denominator), out)
    elif _wire_number(v, "decimal", "Decimal"):
        raw = str(v).encode()
        out += [b"D", _wire_len(len(raw)), raw]
    elif other is None and hasattr(type(v), "__next__") and hasattr(type(v), "__iter__"):
        items = []
        for item in v:
            if len(items) >= WIRE_ITEMS:
                raise WireError(f"the iterator gives more than {WIRE_ITEMS} items")
            items.append(item)
        out += [b"g", _wire_len(len(items))]
        for item in items:
            _wire_put(item, out, other, depth + 1)
    elif other is not None:
        kind, key = other(v)  # ("r", number, type name) or ("n", name)
        raw = str(key).encode("utf-8", "replace")
        out += [b"r" if kind == "r" else b"n", _wire_len(len(raw)), raw]
    else:
        raise WireError(f"a {type(v).__name__} cannot be sent")


def _wire_fields(v):
    return getattr(type(v), "_fields", None)


def _wire_number(v, module, name):
    cls = getattr(sys.modules.get(module), name, None)
    return cls is not None and isinstance(v, cls)


def wire_unpack(data, ref=None):
    """The value ``data`` encodes; ``WireError`` for anything else."""
    try:
        value, pos = _wire_get(data, 0, ref, 0)
    except WireError:
        raise
    except (IndexError, ValueError, TypeError, OverflowError, KeyError, ArithmeticError) as exc:
        raise WireError(f"not a value ({type(exc).__name__})") from None
    if pos != len(data):
        raise WireError("not a value (bytes after it)")
    return value


def _wire_take(data, pos):
    n = int.from_bytes(data[pos : pos + 4], "big")
    end = pos + 4 + n
    if len(data) < end:
        raise WireError("not a value (cut short)")
    return data[pos + 4 : end], end


def _wire_get(data, pos, ref, depth):
    if depth > WIRE_DEPTH:
        raise WireError("the value is nested too deeply")
    tag = data[pos : pos + 1]
    pos += 1
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], pos
    if tag == b"i":
        raw, pos = _wire_take(data, pos)
        return int.from_bytes(raw, "little", signed=True), pos
    if tag == b"f":
        return _WIRE_F.unpack_from(data, pos)[0], pos + 8
    if tag == b"c":
        return complex(_WIRE_F.unpack_from(data, pos)[0], _WIRE_F.unpack_from(data, pos + 8)[0]), (
            pos + 16
        )
    if tag in (b"s", b"b", b"y", b"D", b"r", b"n"):
        raw, pos = _wire_take(data, pos)
        if tag == b"s":
            return raw.decode("utf-8", "surrogatepass"), pos
        if tag in (b"b", b"y"):
            return (bytes(raw) if tag == b"b" else bytearray(raw)), pos
        if tag == b"D":
            import decimal

            return decimal.Decimal(raw.decode("ascii")), pos
        if ref is None:
            raise WireError("not a value (a reference)")
        return ref(tag.decode(), raw.decode("utf-8", "replace")), pos
    if tag in (b"R", b"Q"):
        nums = []
        for _ in range(3 if tag == b"R" else 2):
            raw, pos = _wire_take(data, pos)
            nums.append(int.from_bytes(raw, "little", signed=True))
        if tag == b"R":
            return range(*nums), pos
        if max(n.bit_length() for n in nums) > WIRE_FRACTION_BITS:
            raise WireError(f"a Fraction of more than {WIRE_FRACTION_BITS} bits")
        import fractions

        return fractions.Fraction(*nums), pos
    if tag == b"P":
        (name, fields, items), pos = _wire_get(data, pos, ref, depth + 1)
        key = (str(name), tuple(str(f) for f in fields))
        if key not in _WIRE_TUPLES and len(_WIRE_TUPLES) < 1000:
            _WIRE_TUPLES[key] = _wire_tuple_class(*key)
        return (_WIRE_TUPLES.get(key) or _wire_tuple_class(*key))(*items), pos
    if tag in (b"l", b"t", b"S", b"Z", b"g", b"d", b"O", b"C"):
        n = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if n > len(data) - pos:
            raise WireError("not a value (too many items)")
        items = []
        for _ in range(2 * n if tag in (b"d", b"O", b"C") else n):
            item, pos = _wire_get(data, pos, ref, depth + 1)
            items.append(item)
        if tag in (b"S", b"Z", b"d", b"O", b"C"):
            _wire_spread(items if tag in (b"S", b"Z") else items[::2])
        if tag in (b"d", b"O", b"C"):
            pairs = zip(items[::2], items[1::2], strict=True)
            if tag != b"d":
                import collections

                kind = collections.OrderedDict if tag == b"O" else collections.Counter
                return kind(dict(pairs)), pos
            return dict(pairs), pos
        kinds: dict = {b"l": list, b"t": tuple, b"S": set, b"Z": frozenset, b"g": iter}
        return kinds[tag](items), pos
    raise WireError("not a value (unknown tag)")


def _wire_tuple_class(name, fields):
    import collections

    return collections.namedtuple(name, fields, rename=True)


def _wire_spread(keys):
    """Keys whose hashes are spread enough for a set or dict to be built in linear time:
    distinct keys of one hash (ints ``i * (2**61 - 1)`` all hash to 0) make it quadratic."""
    if len(keys) < 2000:
        return
    import collections

    counts = collections.Counter(map(hash, keys))  # hash values hash to themselves: linear
    if sum(c * c for c in counts.values()) > WIRE_COLLIDING:
        raise WireError("its keys share too few hash values to be built in time")


def wire_send(fd, value, other=None):
    data = wire_pack(value, other)
    view = memoryview(_wire_len(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def wire_read(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def wire_recv(fd, ref=None):
    """The next frame's value; ``EOFError`` when the other end is gone."""
    n = int.from_bytes(wire_read(fd, 4), "big")
    if n > WIRE_MAX:
        raise WireError(f"a frame of {n} bytes")
    return wire_unpack(wire_read(fd, n), ref)
