"""rewriter/demangle.py and the selection by demangled names, without a compiler:
symbols as GCC and rustc write them, each with the names it is shown and accepted by."""

from __future__ import annotations

import pytest

from urewrite.errors import UrewriteError
from urewrite.rewriter import demangle
from urewrite.rewriter.functions import Function
from urewrite.rewriter.selectors import select
from urewrite.trampolines.region import KIND_ENTRY, KIND_RETURN


@pytest.mark.parametrize("symbol, display, accepted", [
    ("_ZN3app5parseEPKc", "app::parse(char const*)", ["app::parse"]),
    # a template function's mangling has its return type: shown without it
    ("_ZN3app5twiceIiEET_S1_", "app::twice<int>(int)",
     ["int app::twice<int>(int)", "app::twice<int>", "app::twice"]),
    ("_ZNSt6vectorIiSaIiEE9push_backERKi",
     "std::vector<int, std::allocator<int> >::push_back(int const&)",
     ["std::vector<int, std::allocator<int> >::push_back"]),
    ("_ZStlsISt11char_traitsIcEERSt13basic_ostreamIcT_ES5_PKc",
     "std::operator<< <std::char_traits<char> >(std::basic_ostream<char, std::char_traits<char> "
     ">&, char const*)", ["std::operator<< <std::char_traits<char> >", "std::operator<<"]),
    ("_ZN3appssERKNS_1AES2_", "app::operator<=>(app::A const&, app::A const&)",
     ["app::operator<=>"]),
    ("_ZN3app1XltERKS0_", "app::X::operator<(app::X const&)", ["app::X::operator<"]),
    ("_ZN3app1XptEv", "app::X::operator->()", ["app::X::operator->"]),
    ("_ZN3app1XixEi", "app::X::operator[](int)", ["app::X::operator[]"]),
    ("_ZN3app1XnwEm", "app::X::operator new(unsigned long)", ["app::X::operator new"]),
    ("_ZnwIiEPvmT_", "operator new<int>(unsigned long, int)",  # (its space is the operator's)
     ["void* operator new<int>(unsigned long, int)", "operator new<int>", "operator new"]),
    ("_ZNK3app1XcvPFivEEv", "app::X::operator int (*)()() const",
     ["app::X::operator int (*)()"]),
    ("_ZZ4mainENKUliE_clEi", "main::{lambda(int)#1}::operator()(int) const",
     ["main::{lambda(int)#1}::operator()"]),
    ("_ZN12_GLOBAL__N_13fooEv", "(anonymous namespace)::foo()", ["(anonymous namespace)::foo"]),
    ("_ZN3app1XD0Ev", "app::X::~X()", ["app::X::~X"]),
    # a GCC clone is a function of its own: every name says so
    ("_ZNK3app5PointplERKS0_.isra.0",
     "app::Point::operator+(app::Point const&) const [clone .isra.0]",
     ["app::Point::operator+ [clone .isra.0]"]),
    ("_ZN3app1fEi.constprop.0.cold", "app::f(int) [clone .constprop.0] [clone .cold]",
     ["app::f [clone .constprop.0] [clone .cold]"]),
    # too odd to take apart (it returns a function pointer), or special: as printed
    ("_ZN3app1gIiEEPFviEi", "void (*app::g<int>(int))(int)", []),
    ("_ZTv0_n24_N3app3Srv6handleEi", "virtual thunk to app::Srv::handle(int)", []),
    # Rust, legacy: no hash shown; v0: no crate disambiguator
    ("_ZN6rtrial7compute4work17hf7ab8bb9a395fd49E", "rtrial::compute::work",
     ["rtrial::compute::work::hf7ab8bb9a395fd49"]),
    ("_ZN62_$LT$rtrial..shapes..Rect$u20$as$u20$rtrial..shapes..Shape$GT$4area17hba034a0b61"
     "76eb01E", "<rtrial::shapes::Rect as rtrial::shapes::Shape>::area",
     ["<rtrial::shapes::Rect as rtrial::shapes::Shape>::area::hba034a0b6176eb01"]),
    ("_ZN4core3ptr42drop_in_place$LT$alloc..string..String$GT$17h0123456789abcdefE.llvm.4242",
     "core::ptr::drop_in_place<alloc::string::String>",
     ["core::ptr::drop_in_place<alloc::string::String>::h0123456789abcdef",
      "core::ptr::drop_in_place"]),
    ("_RNvXNtCs8vpgJ6qBXv_6rtrial6shapesNtB2_4RectNtB2_5Shape4area",
     "<rtrial::shapes::Rect as rtrial::shapes::Shape>::area", []),
    ("_RINvNtCs8vpgJ6qBXv_6rtrial7compute7largestmEB4_", "rtrial::compute::largest::<u32>",
     ["rtrial::compute::largest"]),
])
def test_names_of_a_symbol(symbol, display, accepted):
    d = demangle.demangle(symbol)
    assert d.display == display
    names = demangle.accepted(d)
    assert names[0] == display
    assert set(names) - {display} - set(accepted) <= {d.full}  # (C++: as printed too)
    assert set(accepted) <= set(names)


@pytest.mark.parametrize("symbol", ["main", "f", "_start", "_Zinvalid", "_Rbad", "__libc_free",
                                    "_ZN3app1fEi.not-a-clone", "i"])
def test_what_is_no_mangled_name_stays_as_it_is(symbol):
    assert demangle.demangle(symbol) is None
    assert demangle.demangle_all([symbol]) == {}


FUNCTIONS = [
    Function("f", 0x1000, 16, "symtab"),  # a C function f
    Function("_Z1fv", 0x2000, 16, "symtab"),  # C++: f()
    Function("_Z1fi", 0x3000, 16, "symtab"),  # C++: f(int)
    Function("_ZN3app1XixEi", 0x4000, 16, "symtab"),  # app::X::operator[](int)
    Function("_ZN3app3SrvC2Ev", 0x5000, 16, "symtab", ("_ZN3app3SrvC1Ev",)),  # app::Srv::Srv()
    # std::vector<std::vector<int, std::allocator<int> >, ...>::size() const
    Function("_ZNKSt6vectorIS_IiSaIiEESaIS1_EE4sizeEv", 0x6000, 16, "symtab"),
    Function("_ZN3app1XrsEi", 0x7000, 16, "symtab"),  # app::X::operator>>(int)
    Function("_ZN6rtrial7compute4work17h0123456789abcdefE", 0x8000, 16, "symtab"),
    Function("_ZN3app1gEi.isra.0", 0x9000, 16, "symtab"),  # app::g(int) [clone .isra.0]
    Function("_ZN3app5twiceIiEET_S1_", 0xa000, 16, "symtab"),  # int app::twice<int>(int)
]


def _named(specs, returns=(), exclude=()):
    return [(s.name, s.address, s.kind, s.exact)
            for s in select(specs, FUNCTIONS, None, return_specs=returns, exclude=exclude)]


def test_a_symbols_own_name_comes_first():
    """`f` is the C function's name: as before demangling, it selects that one only;
    f() and f(int) by their demangled names."""
    assert _named(["f"]) == [("f", 0x1000, KIND_ENTRY, True)]
    assert _named(["f()"]) == [("f()", 0x2000, KIND_ENTRY, True)]
    assert _named(["f(int)"], ["f(int)"]) == [("f(int)", 0x3000, KIND_RETURN, True),
                                             ("f(int)", 0x3000, KIND_ENTRY, True)]


def test_a_glob_reports_display_names_and_symbols_it_matched_alone():
    assert _named(["f*"]) == [("f", 0x1000, KIND_ENTRY, False), ("f()", 0x2000, KIND_ENTRY, False),
                              ("f(int)", 0x3000, KIND_ENTRY, False)]
    assert _named(["_Z1f*"]) == [("_Z1fv", 0x2000, KIND_ENTRY, False),
                                 ("_Z1fi", 0x3000, KIND_ENTRY, False)]
    # aliases that demangle alike: one probe, under the one display name
    assert _named(["app::Srv::*"]) == [("app::Srv::Srv()", 0x5000, KIND_ENTRY, False)]


@pytest.mark.parametrize("glob, address, name", [
    # each matches a name other than the display one, which it does not match
    ("rtrial::compute::work::h0123*", 0x8000, "rtrial::compute::work"),
    ("app::g [clone .isra*", 0x9000, "app::g(int) [clone .isra.0]"),
    ("int app::tw*", 0xa000, "app::twice<int>(int)"),
    ("*::twice", 0xa000, "app::twice<int>(int)"),
    ("app::twic?", 0xa000, "app::twice<int>(int)"),
])
def test_a_glob_matches_names_besides_the_display_name(glob, address, name):
    assert _named([glob]) == [(name, address, KIND_ENTRY, False)]


def test_brackets_in_a_demangled_name_are_no_glob():
    assert _named(["app::X::operator[]"]) == [("app::X::operator[]", 0x4000, KIND_ENTRY, True)]
    assert _named(["app::X::operator[](int)"]) == [
        ("app::X::operator[](int)", 0x4000, KIND_ENTRY, True)]


def test_llvm_spelling_of_templates_is_accepted():
    """GCC's demangler closes nested templates with '> >', LLVM's tools with '>>': a name
    copied from either selects the function, reported as typed."""
    gcc = "std::vector<std::vector<int, std::allocator<int> >, std::allocator<std::vector<int, " \
          "std::allocator<int> > > >::size"
    llvm = gcc.replace("> >", ">>").replace("> >", ">>")
    assert ">>" in llvm and _named([llvm]) == [(llvm, 0x6000, KIND_ENTRY, True)]
    assert _named([gcc]) == [(gcc, 0x6000, KIND_ENTRY, True)]
    assert _named(["app::X::operator>>"]) == [("app::X::operator>>", 0x7000, KIND_ENTRY, True)]


def test_exclude_takes_demangled_names():
    assert [n for n, *_ in _named(["*"], exclude=["f(?*)", "app::*", "std::*", "rtrial::*"])] \
        == ["f", "f()"]
    assert [n for n, *_ in _named(["f*", "app::*"], exclude=["app::X::operator?]", "*::g*"])] \
        == ["f", "f()", "f(int)", "app::Srv::Srv()", "app::X::operator>>(int)",
            "app::twice<int>(int)"]


def test_an_unknown_name_hints_at_demangled_ones():
    with pytest.raises(UrewriteError, match=r"no function named 'app::Srv::Sv' \(close matches: "
                                            r"app::Srv::Srv"):
        select(["app::Srv::Sv"], FUNCTIONS, None)
    with pytest.raises(UrewriteError, match=r"no function named '_Z1fd' \(close matches: _Z1f"):
        select(["_Z1fd"], FUNCTIONS, None)
