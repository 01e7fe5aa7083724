"""Probe programs shared by the x86_64 and arm64 tests, and readers of what they print.

The programs the `run` and build-time tests hold to the reference evaluator (and that to
bpftrace), the work the compiled-code tests feed them, and the arm64 side's builds of
samples/programs/values.c under qemu.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import struct
from pathlib import Path

from conftest import check, urewrite
from cross import BP, CC, LIB_INIT, LIB_INIT_C, QEMU
from urewrite.programs import output
from urewrite.programs.checks import check as check_program
from urewrite.programs.evaluate import Hit, State, run_block
from urewrite.programs.parser import parse

ROOT = Path(__file__).resolve().parent.parent
VALUES = ROOT / "samples" / "programs" / "values.c"

# -- programs ------------------------------------------------------------------------------

PROGRAM = """
uprobe:{path}:work /arg0 > 10/ {{
    @c[arg1] = count(); @h = hist(arg0 * 1000); @l = lhist(arg0, 0, 1000, 250);
    @s[arg1 % 3] = sum(arg0); @a = avg(arg0); @st = stats(arg1); @mi = min(arg0); @ma = max(arg0);
    $x = arg0 / 3 - (int64)arg1 * 7; @calc = sum($x); @sign[$x < 0] = count();
    if (arg1 == 3) {{ @three++ }} else {{ @other += 2 }}
}}
uprobe:{path}:work {{ @start[tid] = nsecs; }}
uprobe:{path}:work /arg0 % 100 == 0/ {{ printf("at %d: %d %s %c\\n", arg0, arg1 * 2, comm, 66); }}
uretprobe:{path}:work /@start[tid]/ {{
    @r = lhist((int64)retval + 3000, 0, 6000, 1000); @took = count(); delete(@start[tid]);
}}
"""


MATRIX_PROGRAM = """
uprobe:{path}:{work} /arg0 > 10/ {{
    @c[arg1] = count(); @s[arg1 % 3] = sum(arg0); @h = hist(arg0); @mx = max(arg0);
}}
uprobe:{path}:{work} {{ @start[tid] = nsecs; }}
uretprobe:{path}:{work} /@start[tid]/ {{
    @r = lhist((int64)retval + 3000, 0, 6000, 1000); @took = count(); delete(@start[tid]);
}}
uprobe:{path}:{named} {{ @w[arg1 % 5] = count(); }}
"""


FLOATS = r"""
uprobe:./v:work /farg0 > 1.5/ { @big = count(); }
uprobe:./v:work {
    @cmp[farg0 < farg1, farg0 == farg1, farg0 != farg1, farg0 >= -0.0] = count();
    @f32[(float)farg2 <= 0.1, (float)farg2 > -3, 2.5 > (float)farg2, (float)farg2 < 0.3,
         (float)farg2 >= -0.7, (float)farg2 == 0.3, (float)farg2 != 0.5] = count();
    @whole = sum(farg0); @lo = min(farg1); @hi = max(farg1); @h = hist(farg0);
    @t[(int32)farg1, (uint8)farg0] = count(); @l = lhist(farg1, 0, 100, 10);
    @key[(float)farg2] = count(); @val = farg0; @by[farg3 > 1e300] = farg3;
    $d = farg3;
    if ($d > 100 || $d != $d) { printf("%f %g %e %.3f\n", $d, (float)farg2, farg1, 0.25); }
}
uretprobe:./v:work { @r[fretval >= 0, fretval < -1e-300] = count(); @rv = avg(fretval); }
"""


def float_words(rng, count):
    """Doubles' bits: the awkward ones (zeros, infinities, NaNs, the ends of int64's
    range, denormals), small and large numbers, and any bits at all."""
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, 1.5, -1.5, 2.0**63,
               -2.0**63, 2.0**62 + 2048, 1e300, -1e300, 5e-324, 0.1, 99.9, 100.0, 2.0**53 + 2]
    numbers = special + [rng.uniform(-200, 200) for _ in range(count)] + \
        [rng.uniform(-1e19, 1e19) for _ in range(count // 4)]
    words = [struct.unpack("<Q", struct.pack("<d", x))[0] for x in numbers]
    words += [rng.getrandbits(64) for _ in range(count // 4)]
    # floats in the low half (as a caller leaves a float argument), the rest 0
    words += [struct.unpack("<I", struct.pack("<f", rng.uniform(-4, 4)))[0] for _ in range(count // 4)]
    # and the floats on each side of constants a float cannot hold (0.1, 0.3, -0.7)
    for constant in (0.1, 0.3, -0.7):
        nearest = struct.unpack("<I", struct.pack("<f", constant))[0]
        words += [nearest - 1, nearest, nearest + 1] * 8
    return words


def float_hits(count: int, seed: int = 11):
    """Hits of FLOATS' probes: entries with four registers of float_words(), returns."""
    rng = random.Random(seed)
    words = float_words(rng, count)
    # each word in every register once (the awkward ones first), then at random
    hits = [hit for word in words for hit in (("uprobe:./v:work", {"fargs": (word,) * 4}),
                                              ("uretprobe:./v:work", {"fretval": word}))]
    for _ in range(len(words)):
        hits.append(("uprobe:./v:work", {"fargs": tuple(rng.choice(words) for _ in range(4))}))
        hits.append(("uretprobe:./v:work", {"fretval": rng.choice(words)}))
    return hits


# -- what programs print --------------------------------------------------------------------

def maps_of(stdout: str) -> str:
    """What follows the command's own output: the maps."""
    return stdout.split("\n\n\n", 1)[1]


def ties_sorted(text: str):
    """bpftrace leaves entries of equal value in its hash table's order: sort each
    run of them, so that the comparison holds the rest to the line."""
    lines, out, run = text.splitlines(), [], []
    pattern = re.compile(r"(@\w*)\[.*\]: (-?\d+)$")
    for line in lines + [""]:
        match = pattern.match(line)
        if run and (not match or (match.group(1), match.group(2)) != run[0][0]):
            out.extend(sorted(l for _, l in run))
            run = []
        if match:
            run.append(((match.group(1), match.group(2)), line))
        else:
            out.append(line)
    return out


# a C callback that reads its probe's name, number and kind, its pid and its area (and no
# argument), its context's pointer where its compiler keeps it: Backend.context_read
# finds those words (tests/test_callbacks.py, tests/test_built_in_calls.py)
READS = ('#include "urewrite.h"\n'
         'UREWRITE_MAP(m, UREWRITE_COUNT, 3);\n'
         'void f(struct urewrite_context *c)\n'
         '{\n'
         '    uint64_t k[3];\n'
         '    c->area[0] += 1;\n'
         '    k[0] = (uint64_t)c->name[0];\n'
         '    k[1] = c->probe + c->area[0] % 2 * 100;\n'
         '    k[2] = (c->pid > 1 && c->pid < 1 << 22) * 10 + (c->kind == UREWRITE_KIND_ENTRY);\n'
         '    urewrite_map_update(c, &m, k, 0);\n'
         '}\n')


# -- compiled code, fed hits directly (test_program_code, test_aarch64_program_code) --------

WORK = [("uprobe:./v:work", {"args": (i, i % 7)}) for i in range(1000)] + \
       [("uretprobe:./v:work", {"retval": i * 3 - (i % 7) * 500}) for i in range(1000)]

PROGRAMS = {
    "probe_keys": """
        uprobe:./v:work { @[probe] = count(); @k[probe, arg1 % 3] = sum(arg0); }
    """,
    "aggregations": """
        uprobe:./v:work { @c[arg1] = count(); @two[arg1, arg1 % 2] = count();
            @h = hist(arg0 - 300); @hk[arg1 % 2] = hist(arg0 * 1000003);
            @l = lhist(arg0, 100, 600, 100); @lk[arg1 % 2] = lhist(arg0, 0, 1000, 500);
            @s[arg1] = sum(arg0); @a = avg(arg0); @ak[arg1 % 2] = avg(arg0);
            @mi = min(arg0 - 500); @ma = max(arg0); @st = stats(arg0); @stk[arg1 % 3] = stats(arg0);
            @v = arg0; @z[arg1] = 5; @ = count(); @neg = max((int64)arg0 - 5000); }
        uretprobe:./v:work /(int64)retval < 0/ { @r = hist(retval); @rmin = min(retval); }""",
    "arithmetic": """
        uprobe:./v:work /arg0 - 500 > 100/ {
            @wrapped = count(); $x = arg0 / 7 + arg0 % 5 - (arg0 << 2 >> 3); @calc = sum($x);
            $y = (int64)arg0 - 600; @sdiv = sum($y / 7 + $y % 5 + ($y >> 2));
            @zdiv = sum(arg0 / (arg1 - arg1) + arg0 % (arg1 * 0));
            if (arg1 > 3) { @big++ } else if (arg1 == 0) { @zero += 2 } else { @small = max(arg1 * 2) }
            @t[arg0 & 1 ? 10 : 20] = count(); @c8 = sum((int8)arg0); @u16 = sum((uint16)(arg0 * 5000));
            @neg8[(int8)(arg0 * 3) < 0] = count(); @logic[arg1 > 2 && arg0 % 3 == 0 || !arg1] = count();
            @bits = sum(~arg0 ^ (arg0 | 3) & 0xff); @m[-(int64)arg0 % 9] = count();
        }""",
    "by_constants": """
        uprobe:./v:work { @d7 = sum(arg0 / 7); @m7 = sum(arg0 % 7); @k[arg0 % 1000] = count();
            @d1000 = sum(arg0 / 1000); @p = sum(arg0 / 64 + arg0 % 64 + arg0 / 1 + arg0 % 1);
            @big = sum(arg0 / 0x8000000000000001 + arg0 % 0xfffffffffffffffd);
            @odd = sum(arg0 / 1000003 + arg0 % 641 + arg0 / -7 + arg0 % -1000);
            @s = sum((int64)arg0 / 7 + (int64)arg0 % 1000); }""",
    "reads_maps": """
        uprobe:./v:work { @seen[arg1] = count(); @last[arg1] = arg0; @acc += arg0;
            @mean = avg(arg0); @r[arg1] = @seen[arg1] * 100 + @mean; }
        uretprobe:./v:work /@seen[3] > 100/ { @after = count(); @key[@last[2] % 4] = count(); }""",
    "printf": """
        uprobe:./v:work /arg0 % 97 == 0/ { printf("%d %u %x|%-4d %s!\\n", (int64)arg0 - 500,
            arg1, arg0, arg1, comm); printf("%5d|\\n", arg1);
            printf("%c%c\\n", 65 + arg1, 97); @n = count(); }
        uretprobe:./v:work /(int64)retval < -2950/ { printf("ret %d\\n", retval); }""",
    "map_actions": """
        uprobe:./v:work { @c[arg1] = count(); @s = sum(arg0); @h = hist(arg0); @lo = min(arg0);
            if (arg0 % 250 == 3) { print(@c); print(@lo); clear(@c); zero(@s); }
            if (arg0 % 400 == 7) { zero(@h); zero(@lo); print(@h); } }
        uretprobe:./v:work /retval % 333 == 0/ { print(@s); }""",
    "latency": """
        uprobe:./v:work { @start[tid] = nsecs; }
        uretprobe:./v:work /@start[tid]/ { @ns = hist(nsecs - @start[tid]); @left[tid] = count();
            delete(@start[tid]); }""",
    # the same entry looked up again in a hit (programs/reuse.py keeps the first one's):
    # after a delete, a find that found nothing, an insert, across if/else and ?:, by two
    # keys and by arithmetic; by a $variable (looked up each time)
    "lookups_again": """
        uprobe:./v:work { @m[arg1 % 3, arg0 & 1] = sum(arg0);
            @got = sum(@m[arg1 % 3, arg0 & 1] + @m[arg1 % 3, arg0 & 1] * 2);
            if (arg0 % 5 == 0) { delete(@m[arg1 % 3, arg0 & 1]); @after = sum(@m[arg1 % 3, arg0 & 1]); }
            @seen = sum(@m[arg1 % 3, arg0 & 1]);
            @none = sum(@n[arg1] + 1); @n[arg1] = count(); @once = sum(@n[arg1]);
            $k = arg1; @v[$k] = sum(1); $k = arg1 + 1; @w = sum(@v[$k] + @v[arg1]);
            @t = sum(arg0 & 2 ? @v[arg1] : @n[arg1]); @u = sum(@v[arg1]);
            if (arg1 == 2) { @b[arg0 % 4] = count(); } @bb = sum(@b[arg0 % 4] + 1); }
        uretprobe:./v:work /@n[3] > 10/ { @r = sum(@n[3]); delete(@n[3]); @r2 = sum(@n[3] + 7); }
        uretprobe:./v:work { @before = sum(@q[2]); @q[retval % 3] = count(); @after = sum(@q[2]); }""",
}

CHECKED_READS = """
    uprobe:./v:named { @w[str(arg0)] = count(); @short[str(arg0, 3)] = count();
        @is_beta[str(arg0) == "beta"] = count(); @who[comm, arg1 % 2] = count();
        @u32 = sum(*(uint32 *)arg2); @i16 = sum(*(int16 *)(arg2 + 4)); @i8 = min(*(int8 *)(arg2 + 6));
        @far = sum(*(uint64 *)(arg2 + 8)); }"""

STRING_MAPS = """
    uprobe:./v:named { @last[arg1 % 3] = str(arg0); @two[arg1 % 2] = str(arg0, 3);
        @copy[arg1 % 4] = @last[(arg1 + 1) % 3]; @is[@last[0] == "alpha"] = count();
        @by[@copy[arg1 % 4]] = count(); if (arg1 == 41) { delete(@two[1]); }
        if (arg1 % 13 == 0) { printf("%s|\\n", @last[1]); } }"""


# -- arm64: values.c under qemu -------------------------------------------------------------

# what comm is under qemu-user: the emulator's name (bpftrace would say the same)
COMM = os.path.basename(shutil.which(QEMU) or QEMU)[:15]


def build_arm64(work: Path, source: Path, name: str, flags, program_for) -> Path:
    """`source` built for arm64 as work/plain/NAME and rewritten with the probes the
    program names as work/rw/NAME (so that both have the same name)."""
    (work / "plain").mkdir(exist_ok=True)
    (work / "rw").mkdir(exist_ok=True)
    plain, rewritten = work / "plain" / name, work / "rw" / name
    check([CC, *flags, str(source), "-o", str(plain)])
    proc = urewrite(str(plain), "-e", program_for(rewritten), "-o", str(rewritten), "-q")
    assert proc.returncode == 0, proc.stderr
    return rewritten


def evaluated(program: str, calls: int, threads: int = 1):
    """(the maps as `run` prints them, the printf() lines) the evaluator gives for
    values.c's calls: work(i, i % 7) returning 3i - 500 (i % 7), then named(word, i);
    thread t making the calls i = t, t + T, ... (one call of a thread at a time)."""
    checked = check_program(parse(program))
    state = State(checked)
    by_kind = {}
    for block in checked.program.blocks:
        for probe in block.probes:
            kind = probe.kind + ":" + (probe.function or "")
            by_kind.setdefault(kind, []).append((block, probe))

    def hit(kind, **fields):
        for block, probe in by_kind.get(kind, ()):
            run_block(state, block, Hit(probe, comm=COMM, **fields))
    clock = 0
    for i in range(calls):
        tid = 1 + i % threads
        clock += 1000
        hit("uprobe:work", args=(i, i % 7), tid=tid, nsecs=clock)
        hit("uretprobe:work", retval=(3 * i - 500 * (i % 7)) & (2**64 - 1), tid=tid,
            nsecs=clock + 10)
        hit("uprobe:named", args=(0, i), tid=tid, nsecs=clock)
    return output.text(list(state.maps.values())), state.printed


def bti_library(tmp_path):
    """values.c split in two, the library BTI-marked (no start files: qemu maps its pages
    guarded), in tmp_path/plain: (the library, where its rewrite goes, the main program)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "rw").mkdir()
    library, rewritten = tmp_path / "plain" / "libvalues.so", tmp_path / "rw" / "libvalues.so"
    (tmp_path / "init.c").write_text(LIB_INIT_C)
    check([CC, "-O2", BP, "-fPIC", "-shared", "-nostartfiles", f"-Wl,-init,{LIB_INIT}",
           "-DVALUES_LIBRARY", str(VALUES), str(tmp_path / "init.c"), "-o", str(library)])
    main = tmp_path / "plain" / "values"
    check([CC, "-O2", "-pthread", "-DVALUES_MAIN", str(VALUES), "-L", str(tmp_path / "plain"),
           "-lvalues", "-o", str(main)])
    return library, rewritten, main


# -- random programs: the compiled code against the evaluator ---------------------------------

class RandomProgram:
    """A random program of integer (and some floating-point) expressions over a probe's
    arguments: arithmetic of both signs and every width, shifts past 63, division by 0,
    casts, comparisons, ?:, && and ||, $variables, plain maps read back, aggregations
    with keys, if/else and printf(). What it must do is what the evaluator says."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.variables, self.values, self.maps = [], [], 0
        self.named = 0  # $variables made (one assigned in a branch is not used after it,
        # and its name is not used again: bpftrace keeps a variable's first type)

    def program(self) -> str:
        predicate = f"/{self.expression(2)}/ " if self.rng.random() < 0.3 else ""
        body = " ".join(self.statement(2) for _ in range(self.rng.randint(3, 7)))
        return f"uprobe:./v:work {predicate}{{ {body} }}"

    def statement(self, depth: int) -> str:
        rng = self.rng
        choice = rng.random()
        if choice < 0.2:
            name = f"$v{self.named}"
            self.named += 1
            text = f"{name} = {self.expression(3)};"
            self.variables.append(name)
            return text
        if choice < 0.35:
            name = f"@p{len(self.values)}"
            text = f"{name} = {self.expression(3)};"
            self.values.append(name)
            return text
        if choice < 0.7:
            self.maps += 1
            kind = rng.choice(["count()", "sum({})", "min({})", "max({})", "avg({})",
                               "hist({})", "lhist({}, 0, 100, 10)", "stats({})"])
            keys = ", ".join(self.key() for _ in range(rng.randint(0, 2)))
            target = f"@a{self.maps}" + (f"[{keys}]" if keys else "")
            return f"{target} = {kind.format(self.expression(3))};"
        if choice < 0.85 and depth:
            condition = self.expression(2)
            known = list(self.variables)  # (one assigned in a branch is not after it)
            then = " ".join(self.statement(depth - 1) for _ in range(rng.randint(1, 2)))
            self.variables = list(known)
            otherwise = " ".join(self.statement(depth - 1) for _ in range(rng.randint(0, 2)))
            self.variables = known
            return f"if ({condition}) {{ {then} }}" + \
                (f" else {{ {otherwise} }}" if otherwise else "")
        values = [self.expression(2) for _ in range(rng.randint(1, 3))]
        formats = " ".join(rng.choice(["%d", "%u", "%x", "%ld", "%5d"]) for _ in values)
        return f'printf("{formats}\\n", {", ".join(values)});'

    def key(self) -> str:
        return f"{self.expression(2)} % 5"

    CASTS_BELOW, FLOATS = 0.75, True  # the share of expressions up to casts; floats or not

    def expression(self, depth: int) -> str:
        rng = self.rng
        if depth == 0 or rng.random() < 0.25:
            return self.leaf()
        choice = rng.random()
        if choice < 0.45:
            operator = rng.choice(["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>",
                                   "==", "!=", "<", ">", "<=", ">=", "&&", "||"])
            return self.binary(self.expression(depth - 1), operator, self.expression(depth - 1))
        if choice < 0.6:
            return self.unary(rng.choice(['-', '~', '!']), self.expression(depth - 1))
        if choice < self.CASTS_BELOW:
            width = rng.choice(["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                "int64", "uint64"])
            return f"({width})({self.expression(depth - 1)})"
        if choice < 0.85 or not self.FLOATS:
            return (f"({self.expression(depth - 1)} ? {self.expression(depth - 1)} : "
                    f"{self.expression(depth - 1)})")
        # floating point: a comparison with a number, or a conversion
        register = f"farg{rng.randint(0, 2)}"
        if rng.random() < 0.5:
            operator = rng.choice(["==", "!=", "<", ">", "<=", ">="])
            return f"({register} {operator} {rng.choice(['0.5', '-2', '1e3', '0', '-0.0'])})"
        return f"(int64){register}"

    def binary(self, left: str, operator: str, right: str) -> str:
        return f"({left} {operator} {right})"

    def unary(self, operator: str, operand: str) -> str:
        return f"{operator}({operand})"

    def leaf(self) -> str:
        rng = self.rng
        choice = rng.random()
        if choice < 0.4:
            return f"arg{rng.randint(0, 3)}"
        if choice < 0.5 and self.variables:
            return rng.choice(self.variables)
        if choice < 0.6 and self.values:
            return rng.choice(self.values)
        if choice < 0.65:
            return rng.choice(["tid", "nsecs"])
        return str(rng.choice([0, 1, 2, 3, 7, 63, 64, 65, 255, 1000, -1, -7, 2**31, 2**32 + 1,
                               2**63 - 1, -(2**63)]))


class LookupProgram(RandomProgram):
    """A RandomProgram whose maps with keys are read, written and deleted again and again
    in a hit, by a few keys of their own (the hit's arguments and fields, constants,
    arithmetic of those, now and then a $variable), inside if/else, ?: and && too:
    what programs/reuse.py keeps or looks up again, held to the evaluator."""

    KEYS = ["arg0 % 3", "arg1 & 1", "tid", "2", "(arg0 % 3) + 1", "(uint8)arg2 % 4"]

    def program(self) -> str:
        head, _, body = super().program().partition("{ ")  # (both maps assigned somewhere)
        return f"{head}{{ @m0[arg0 % 3] = arg1; @m1[2] = arg0 + 1; {body}"

    def key(self) -> str:
        if self.variables and self.rng.random() < 0.15:
            return f"{self.rng.choice(self.variables)} % 3"
        return self.rng.choice(self.KEYS)

    def statement(self, depth: int) -> str:
        rng, name = self.rng, f"@m{self.rng.randint(0, 1)}"
        choice = rng.random()
        if choice < 0.3:
            return f"{name}[{self.key()}] = {self.expression(2)};"
        if choice < 0.45:
            return f"{name}[{self.key()}] += {self.expression(1)};"
        if choice < 0.55:
            return f"delete({name}[{self.key()}]);"
        if choice < 0.7:
            return f"@r{self.maps}[{self.key()}] = sum({self.expression(2)});"
        if choice < 0.8:  # a key looked for, a key put in (the same one by value?), again
            key = self.key()
            return (f"@seen = sum({name}[{key}]); {name}[{self.key()}] = {self.expression(1)}; "
                    f"@again = sum({name}[{key}]);")
        return super().statement(depth)

    def leaf(self) -> str:
        if self.rng.random() < 0.35:
            return f"@m{self.rng.randint(0, 1)}[{self.key()}]"
        return super().leaf()


def random_hits(seed: int, count: int = 60):
    """Hits of RandomProgram's probe: arguments of every size and sign, and doubles."""
    rng = random.Random(seed)
    pick = [0, 1, 2, 5, 63, 64, 100, 255, 256, 65535, 2**31 - 1, 2**31, 2**32, 2**63 - 1,
            2**63, 2**64 - 1, 2**64 - 5]
    hits = []
    for i in range(count):
        args = tuple(rng.choice(pick) if rng.random() < 0.5 else rng.randrange(2**64)
                     for _ in range(4))
        fargs = tuple(struct.unpack("<Q", struct.pack("<d", rng.choice(
            [0.5, -2.0, 1e3, 0.0, -0.0, 3.7, -1e19, math.nan, math.inf, 1e300, -7.25])))[0]
            for _ in range(3))
        hits.append(("uprobe:./v:work", {"args": args, "fargs": fargs, "tid": i % 3 + 1,
                                         "nsecs": 1000 * i}))
    return hits


class ComparableProgram(RandomProgram):
    """A RandomProgram that bpftrace 0.17 runs as urewrite does (test_program_output.py
    runs both): integers only, over values.c's work(i, i % 7); printf with each integer
    conversion and length; none of the places documented as different
    (docs/programs.md): division and remainder of unsigned operands by a divisor that
    is never 0, shifts by a number below 64, `-` and `~` of a 64-bit value, hist() of
    values below 2G (bpftrace's labels past it), no min() or max() (bpftrace's start
    from 0), no literal -9223372036854775808."""

    def statement(self, depth: int) -> str:
        rng = self.rng
        if rng.random() < 0.1:  # printf, each integer conversion and length
            values = [self.expression(2) for _ in range(rng.randint(1, 3))]
            formats = " ".join(rng.choice(["%d", "%ld", "%u", "%lu", "%x", "%lx", "%hd",
                                           "%5d", "%-3lu"]) for _ in values)
            return f'printf("{formats}\\n", {", ".join(values)});'
        if rng.random() < 0.1:  # a histogram below 2G (bpftrace labels past it its way)
            self.maps += 1
            return f"@a{self.maps} = hist((uint64)({self.expression(2)}) >> 33);"
        while True:
            before = list(self.variables), list(self.values)
            text = super().statement(depth)
            if not re.search(r"printf|hist\(|min\(|max\(", text):
                return text
            self.variables, self.values = before  # (what it assigned is not there)

    CASTS_BELOW, FLOATS = 0.8, False

    def binary(self, left: str, operator: str, right: str) -> str:
        if operator in ("/", "%"):
            return f"((uint64)({left}) {operator} ((uint64)({right}) | 1))"
        if operator in ("<<", ">>"):
            return f"({left} {operator} {self.rng.randint(0, 63)})"
        return f"({left} {operator} {right})"

    def unary(self, operator: str, operand: str) -> str:
        return f"{operator}(({operand}) + 0)"

    returning = False  # making a uretprobe block: retval where an argument would be

    def program(self) -> str:
        """The entry block, and now and then a block at work()'s return (retval). (No
        str(): values.c never touches its words' page, which bpftrace's reads then
        cannot fault in; urewrite's can.)"""
        text = super().program()
        if self.rng.random() < 0.5:
            self.returning, self.variables = True, []
            body = " ".join(self.statement(1) for _ in range(self.rng.randint(1, 3)))
            text += f" uretprobe:./v:work {{ {body} }}"
            self.returning = False
        return text

    def leaf(self) -> str:
        # (not -9223372036854775808: bpftrace types 9223372036854775808 unsigned, and so
        # its negation; urewrite reads the whole as int64's least)
        while True:
            text = super().leaf()
            if self.returning and text.startswith("arg"):
                text = self.rng.choice(["retval", "(int64)retval"])
            if text not in ("tid", "nsecs", "arg2", "arg3", str(-(2**63))):
                return text

    def key(self) -> str:
        return f"(uint64)({self.expression(2)}) % 5"
