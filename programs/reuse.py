"""A map's entry found once a hit: `/@s[tid]/ { ... hist(nsecs - @s[tid]); delete(@s[tid]); }`
looks `@s[tid]` up three times; the entry the first lookup found is kept in a local and
read from there by the others (a lookup hashes the key and probes the table: a few ns).

Safe because an entry never moves: a table claims a slot for a key and keeps it (a
`delete()` marks it absent), so a lookup of the same key later in the same hit finds
the same slot. Reused only where that holds without a doubt:
  - the keys are computed from the hit alone (arguments, the context's fields,
    constants, and arithmetic of those), never from a $variable, a map or memory;
  - the first lookup dominates the later one: no label between them (a label is
    where paths join, of an if, a ?:, && or ||);
  - a `find` (which gives 0 for a missing key) serves later finds only, until an
    insert into the same map by any key (which may be the same key by value: `@m[2]`
    then `@m[tid]` where tid is 2); an `entry` (which inserts it) serves both.
"""

from __future__ import annotations

from typing import Callable, List, Optional

_PUSHES = ("ctx", "arg", "const")  # one value of the hit, nothing read from memory
_SAME_DEPTH = ("cast", "unary")  # one value in, one out
_LOOKUPS = ("find", "entry")


def reuse_lookups(ops: List[tuple], temp: Callable[[], int]) -> List[tuple]:
    """`ops` with each repeated lookup read from a local (`temp()` gives a new one)."""
    keep = {}  # a first lookup's index -> its local
    reused = {}  # a later lookup's key start -> (its index, the first one's)
    cache = {}  # (map, key ops) -> (the lookup's index, whether it inserts)
    for at, op in enumerate(ops):
        if op[0] == "label":  # paths join: forget
            cache.clear()
        if op[0] not in _LOOKUPS:
            continue
        index = op[1]
        if op[0] == "entry":  # an insert by any key may be of one a find did not find
            for signature in [s for s, (_, inserts) in cache.items()
                              if s[0] == index and not inserts]:
                del cache[signature]
        start = _key_start(ops, at)
        if start is None:
            continue
        signature = (index, tuple(ops[start:at]))
        found = cache.get(signature)  # (an insert found only what an insert kept: above)
        if found is not None:
            keep[found[0]] = None
            reused[start] = (at, found[0])
        else:
            cache[signature] = (at, op[0] == "entry")
    if not reused:
        return ops
    for first in keep:
        keep[first] = temp()
    out, at = [], 0
    while at < len(ops):
        if at in reused:  # its key and lookup: the local the first one filled
            at, first = reused[at]
            out.append(("local", keep[first]))
        else:
            out.append(ops[at])
            if at in keep:
                out += [("set_local", keep[at]), ("local", keep[at])]
        at += 1
    return out


def _key_start(ops: List[tuple], at: int) -> Optional[int]:
    """Where the key of the lookup at `at` starts being computed: its key_word stores,
    each of a value computed from the hit alone; None where a key is other."""
    k = at
    while k > 0 and ops[k - 1][0] == "key_word":
        k -= 1
    need = at - k  # values the key stores take
    if not need:
        return None
    while need:
        if k == 0:
            return None
        name = ops[k - 1][0]
        if name in _PUSHES:
            need -= 1
        elif name == "binary":
            need += 1
        elif name not in _SAME_DEPTH:
            return None
        k -= 1
    return k
