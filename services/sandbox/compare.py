"""An assert's ``==`` and ``in`` in the sandbox's Python tests: plain values compared, so
no program's object can claim to equal what a test expects (the "AlwaysEqual" hack).

Part of the one program run in each sandbox (``bwrap.py`` joins it to the harness).
"""

from __future__ import annotations

# An assert's ``==`` and ``in`` (``programs._Compares``) compare builtin values, which no
# program can redefine: a subclass (Counter, namedtuple, an int with its own __eq__) as its
# base type; another object equals only one of its very type, by its ``__eq__`` (in a list
# or tuple: member by member; in a dict or set: never).
SCALARS = (type(None), bool, int, float, complex, str, bytes)
VIEWS: tuple[type, ...] = (type({}.keys()), type({}.items()))


class NotPlain(Exception):
    pass


def plain(value):
    if type(value) in SCALARS:
        return value
    if isinstance(value, dict):  # the builtin's own methods: a subclass cannot lie to them
        return {plain(k): plain(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [plain(v) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in tuple.__iter__(value))
    if isinstance(value, set):
        return {plain(v) for v in set.__iter__(value)}
    if isinstance(value, frozenset):
        return frozenset(plain(v) for v in frozenset.__iter__(value))
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if type(value) in VIEWS:  # set-like, as Python compares them
        return frozenset(plain(v) for v in value)
    raise NotPlain


def plain_eq(a, b):
    try:
        return plain(a) == plain(b)
    except NotPlain:
        pass
    if type(a) is not type(b) or isinstance(a, dict | set | frozenset):
        return False
    if type(a) in (list, tuple):  # plain containers of other objects: member by member
        return len(a) == len(b) and all(map(plain_eq, a, b))
    return a == b


def plain_in(a, b):
    try:
        a = plain(a)
    except NotPlain:
        return any(plain_eq(a, x) for x in b)
    if type(b) is range:
        return a in b
    try:
        return a in plain(b)
    except NotPlain:  # a container of the program's own: its members, compared as above
        return any(plain_eq(a, x) for x in b)
