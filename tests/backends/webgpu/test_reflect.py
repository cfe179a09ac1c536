"""WGSL binding reflection (`gpud.backends.webgpu.wgsl`): pure Python, no GPU and no wgpu needed."""

from __future__ import annotations

import ast
import dataclasses
import random
import sys
import time
from pathlib import Path

import pytest
from support import ADD_WGSL, SCALE_WGSL

from gpud.backends.webgpu import wgsl
from gpud.backends.webgpu.wgsl.model import Binding, Member, Reflection
from gpud.backends.webgpu.wgsl.reflect import reflect
from gpud.testing.workloads import AXPB_WGSL, AXPW_WGSL

ARRAY = "array<f32>"
BODY = """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) { _ = &x; _ = &y; }
"""
X = "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"


def exact(source: str) -> Reflection:
    r = reflect(source)
    assert r.exact, r.problems
    assert r.problems == ()
    return r


def inexact(source: str) -> Reflection:
    r = reflect(source)
    assert not r.exact
    assert r.problems
    assert r.written() is None
    assert r.written(1) is None
    return r


# Each of these defeated the regex the daemon used before:
# `@binding\(\s*(\d+)\s*\)[^;]*?var\s*<\s*storage\s*,\s*read_write\s*>`
KNOWN_MISSES = {
    "u-suffix": ("@group(0) @binding(1u) var<storage, read_write> y: array<f32>;", {1}),
    "hex": ("@group(0) @binding(0x1) var<storage, read_write> y: array<f32>;", {1}),
    "hex-uppercase-suffix": ("@group(0) @binding(0X1Fu) var<storage, read_write> y: array<f32>;", {31}),
    "trailing-comma": ("@group(0) @binding(1,) var<storage, read_write> y: array<f32>;", {1}),
    "typed-const": ("const ONE: u32 = 1u;\n@group(0) @binding(ONE) var<storage, read_write> y: array<f32>;", {1}),
    "abstract-const": ("const ONE = 1;\n@group(0) @binding(ONE) var<storage, read_write> y: array<f32>;", {1}),
    "const-of-const": (
        "const ONE = 1;\nconst TWO = ONE + 1u;\n@group(0) @binding(TWO) var<storage, read_write> y: array<f32>;",
        {2},
    ),
    "const-declared-after-use": (
        "@group(0) @binding(TWO) var<storage, read_write> y: array<f32>;\nconst TWO: u32 = ONE * 2u;\nconst ONE = 1;",
        {2},
    ),
    "const-group": (
        "const G = 0i;\n@group(G) @binding(G + 1) var<storage, read_write> y: array<f32>;",
        {1},
    ),
    "line-comment-with-semicolon": (
        "@group(0) @binding(1) // weights; scaled in place\nvar<storage, read_write> y: array<f32>;",
        {1},
    ),
    "block-comment": (
        "@group(0) @binding(1) /* weights; scaled in place */ var<storage, read_write> y: array<f32>;",
        {1},
    ),
    "nested-block-comment": (
        "@group(0) @binding(1) /* a /* b; */ c; */ var<storage, read_write> y: array<f32>;",
        {1},
    ),
    "commented-out-declaration": (
        "/* @group(0) @binding(2) var<storage, read_write> z: array<f32>; /* nested */ still a comment */\n"
        "// @group(0) @binding(3) var<storage, read_write> w: array<f32>;\n"
        "@group(0) @binding(1) var<storage, read_write> y: array<f32>;",
        {1},
    ),
    "reversed-attributes": ("@binding(1) @group(0) var<storage, read_write> y: array<f32>;", {1}),
    "separate-lines": ("@group(0)\n@binding(1)\nvar<storage, read_write>\ny: array<f32>;", {1}),
    "extra-whitespace": ("@ group ( 0 )\t@binding (\n 1 \n)  var < storage ,\tread_write > y : array < f32 > ;", {1}),
    "comments-inside-attribute": (
        "@/*a*/binding/*b*/(/*c*/1/*d*/) @group(0) var<storage,read_write> y: array<f32>;",
        {1},
    ),
    "no-spaces": ("@group(0)@binding(1)var<storage,read_write>y:array<f32>;", {1}),
    "template-trailing-comma": ("@group(0) @binding(1) var<storage, read_write,> y: array<f32>;", {1}),
    "storage-defaults-to-read": ("@group(0) @binding(1) var<storage> y: array<f32>;", set()),
    "storage-read": ("@group(0) @binding(1) var<storage, read> y: array<f32>;", set()),
    "uniform": ("struct P { n: u32 }\n@group(0) @binding(1) var<uniform> y: P;", set()),
    "read-write-on-other-group": ("@group(1) @binding(1) var<storage, read_write> y: array<f32>;", set()),
    "line-break-u2028-ends-comment": (
        "// a comment\u2028@group(0) @binding(1) var<storage, read_write> y: array<f32>;",
        {1},
    ),
    "line-break-cr-ends-comment": ("// a comment\r@group(0) @binding(1) var<storage, read_write> y: array<f32>;", {1}),
    "binding-from-expression": (
        "@group(0) @binding((7 / 2 - -1 % 3) * 2 - 6) var<storage, read_write> y: array<f32>;",
        {2},
    ),
    "conversion": ("@group(0) @binding(u32(i32(3u))) var<storage, read_write> y: array<f32>;", {3}),
}


@pytest.mark.parametrize("source, written", list(KNOWN_MISSES.values()), ids=list(KNOWN_MISSES))
def test_known_regex_misses(source: str, written: set[int]) -> None:
    r = exact(X + source + BODY)
    assert r.written() == frozenset(written)
    assert r.written(0) == frozenset(written)
    assert 0 not in (r.written() or ())
    assert [b.name for b in r.bindings] == ["x", "y"]


def test_binding_fields() -> None:
    r = exact(
        """
        struct Params { a: f32, n: u32 }
        @group(0) @binding(0) var<storage, read> x: array< vec4 < f32 > , 4 >;
        @group(0) @binding(1) var<storage, read_write> y: array<f32>;
        @group(2) @binding(5) var<uniform> p: Params;
        """
    )
    assert r.bindings == (
        Binding(0, 0, "x", "storage", "read", "array<vec4<f32>, 4>"),
        Binding(0, 1, "y", "storage", "read_write", ARRAY),
        Binding(2, 5, "p", "uniform", "read", "Params"),
    )
    assert r.group(0) == {0: r.bindings[0], 1: r.bindings[1]}
    assert r.group(2) == {5: r.bindings[2]}
    assert r.group(1) == {}
    assert r.written(0) == frozenset({1})
    assert r.written(2) == frozenset()
    assert r.written(7) == frozenset()


# The kernels the project ships (the workloads `axpb` and `axpw`) and the test kernels `add` and `scale`.
BUILTIN_KERNELS = {
    "axpb": (AXPB_WGSL, {1}, 2, [Member("a", "f32"), Member("b", "f32"), Member("n", "u32")]),
    "axpw": (AXPW_WGSL, {2}, 3, [Member("a", "f32"), Member("n", "u32")]),
    "add": (ADD_WGSL, {2}, 3, [Member("n", "u32")]),
    "scale": (SCALE_WGSL, {1}, 2, [Member("a", "f32")]),
}


@pytest.mark.parametrize("source, written, uniform, members", list(BUILTIN_KERNELS.values()), ids=list(BUILTIN_KERNELS))
def test_builtin_kernels(source: str, written: set[int], uniform: int, members: list[Member]) -> None:
    r = exact(source)
    assert r.written() == frozenset(written)
    assert sorted(r.group(0)) == list(range(uniform + 1))
    for index, b in r.group(0).items():
        assert b.space == ("uniform" if index == uniform else "storage")
        assert b.access == ("read_write" if index in written else "read")
    assert r.uniform_members(0, uniform) == tuple(members)
    assert r.uniform_members(0, 0) is None  # a storage buffer
    assert r.uniform_members(1, uniform) is None  # nothing there


def test_storage_textures_and_other_handles() -> None:
    r = exact(
        """
        alias Out = texture_storage_2d<rgba8unorm, write>;
        @group(0) @binding(0) var src: texture_2d<f32>;
        @group(0) @binding(1) var smp: sampler;
        @group(0) @binding(2) var cmp: sampler_comparison;
        @group(0) @binding(3) var dst: texture_storage_2d<rgba8unorm, write>;
        @group(0) @binding(4) var rw: texture_storage_2d_array<r32float, read_write>;
        @group(0) @binding(5) var ro: texture_storage_3d<r32float, read>;
        @group(0) @binding(6) var depth: texture_depth_2d;
        @group(0) @binding(7) var aliased: Out;
        @group(0) @binding(8) var many: binding_array<texture_storage_2d<rgba8unorm, write>, 4>;
        @group(0) @binding(9) var ext: texture_external;
        """
    )
    assert r.written() == frozenset({3, 4, 7, 8})
    assert {b.binding: b.access for b in r.bindings} == {
        0: "read",
        1: "read",
        2: "read",
        3: "write",
        4: "read_write",
        5: "read",
        6: "read",
        7: "write",
        8: "write",
        9: "read",
    }
    assert {b.space for b in r.bindings} == {"handle"}
    assert r.group(0)[3].type == "texture_storage_2d<rgba8unorm, write>"
    assert r.group(0)[7].type == "Out"


@pytest.mark.parametrize(
    "source",
    [
        "override BASE: u32 = 1u;\nconst ONE = BASE;\n@group(0) @binding(ONE) var<storage, read> y: array<f32>;",
        "override ONE: u32 = 1u;\n@group(0) @binding(ONE) var<storage, read> y: array<f32>;",
        "@id(3) override G = 0;\n@group(G) @binding(1) var<storage, read> y: array<f32>;",
    ],
    ids=["const-from-override", "override", "override-group"],
)
def test_override_makes_the_result_inexact(source: str) -> None:
    r = inexact(X + source)
    assert any("override" in p for p in r.problems)
    assert [b.name for b in r.bindings] == ["x"]  # y's binding is unknown, so it is not listed


INEXACT = {
    "group-only": "@group(0) var<storage, read_write> y: array<f32>;",
    "binding-only": "@binding(1) var<storage, read_write> y: array<f32>;",
    "no-attributes": "var<storage, read_write> y: array<f32>;",
    "negative-binding": "@group(0) @binding(-1) var<storage, read> y: array<f32>;",
    "negative-group": "@group(-1i) @binding(1) var<storage, read> y: array<f32>;",
    "float-binding": "@group(0) @binding(1.0) var<storage, read> y: array<f32>;",
    "shift": "@group(0) @binding(1 << 1) var<storage, read> y: array<f32>;",
    "call": "@group(0) @binding(max(1, 2)) var<storage, read> y: array<f32>;",
    "unknown-name": "@group(0) @binding(NOPE) var<storage, read> y: array<f32>;",
    "float-const": "const F = 1.0;\n@group(0) @binding(u32(F)) var<storage, read> y: array<f32>;",
    "const-not-integer-type": "const F: f32 = 1;\n@group(0) @binding(F) var<storage, read> y: array<f32>;",
    "mixed-signedness": "@group(0) @binding(1i + 1u) var<storage, read> y: array<f32>;",
    "overflow": "@group(0) @binding(4294967295u + 1u) var<storage, read> y: array<f32>;",
    "division-by-zero": "@group(0) @binding(1 / 0) var<storage, read> y: array<f32>;",
    "negated-u32": "@group(0) @binding(-(1u)) var<storage, read> y: array<f32>;",
    "bit-reinterpreting-conversion": "@group(0) @binding(u32(-1i)) var<storage, read> y: array<f32>;",
    "self-referencing-const": "const A = A;\n@group(0) @binding(A) var<storage, read> y: array<f32>;",
    "const-cycle": "const A = B;\nconst B = A + 1;\n@group(0) @binding(A) var<storage, read> y: array<f32>;",
    "duplicate-const": "const A = 1;\nconst A = 2;\n@group(0) @binding(A) var<storage, read> y: array<f32>;",
    "two-binding-attributes": "@group(0) @binding(1) @binding(2) var<storage, read> y: array<f32>;",
    "two-binding-values": "@group(0) @binding(1, 2) var<storage, read> y: array<f32>;",
    "binding-without-value": "@group(0) @binding var<storage, read> y: array<f32>;",
    "empty-binding": "@group(0) @binding() var<storage, read> y: array<f32>;",
    "extra-parenthesis": "@group(0) @binding()) var<storage, read> y: array<f32>;",
    "extra-brace": "fn f() {} }\n@group(0) @binding(1) var<storage, read> y: array<f32>;",
    "storage-write-buffer": "@group(0) @binding(1) var<storage, write> y: array<f32>;",
    "uniform-with-access": "@group(0) @binding(1) var<uniform, read_write> y: u32;",
    "unknown-address-space": "@group(0) @binding(1) var<mystery, read> y: array<f32>;",
    "explicit-handle-space": "@group(0) @binding(1) var<handle> t: texture_2d<f32>;",
    "bad-template": "@group(0) @binding(1) var<storage read> y: array<f32>;",
    "unknown-handle-type": "@group(0) @binding(1) var y: array<f32>;",
    "storage-texture-bad-access": "@group(0) @binding(1) var t: texture_storage_2d<rgba8unorm, sideways>;",
    "alias-cycle": "alias A = B;\nalias B = A;\n@group(0) @binding(1) var t: A;",
    "shadowed-access-mode": "alias read = u32;\n@group(0) @binding(1) var<storage, read> y: array<f32>;",
    "shadowed-u32": "fn u32(v: i32) -> i32 { return v; }\n@group(0) @binding(u32(1)) var<storage> y: array<f32>;",
    "duplicate-var-name": "@group(0) @binding(1) var<storage> y: u32;\n@group(0) @binding(2) var<storage> y: u32;",
    "not-wgsl-character": "@group(0) @binding(1) var<storage, read> y: array<f32>; # comment?",
    "unterminated-block-comment": "@group(0) @binding(1) var<storage, read> y: array<f32>; /* /* */",
    "unexpected-declaration": "let y = 1;",
    "binding-on-a-function": "@group(0) @binding(1) fn f() {}",
    "missing-semicolon": "@group(0) @binding(1) var<storage, read> y: array<f32>",
    "unbalanced-function": "fn f() { { }",
    "bad-struct": "struct S { a: f32; }",
}


@pytest.mark.parametrize("source", list(INEXACT.values()), ids=list(INEXACT))
def test_undetermined_bindings_make_the_result_inexact(source: str) -> None:
    r = inexact(X + source + BODY)
    assert all(p.startswith("line ") for p in r.problems), r.problems


def test_unicode_identifiers() -> None:
    r = exact("const \u00c9TAGE = 1u;\n@group(0) @binding(\u00c9TAGE) var<storage, read_write> donn\u00e9es: u32;")
    assert r.written() == frozenset({1})
    assert r.bindings[0].name == "donn\u00e9es"


def test_problems_name_the_line() -> None:
    r = inexact(X + "\n\n@group(0) @binding(NOPE) var<storage, read> y: array<f32>;")
    assert r.problems[0].startswith("line 4: @binding of 'y'")


def test_an_undetermined_const_is_harmless_until_used() -> None:
    r = exact(
        "override O = 1;\nconst F = 1.5;\nconst C = max(O, 2);\nconst_assert 1 < 2;\n"
        + X
        + "@group(0) @binding(1) var<storage, read_write> y: array<f32>;"
    )
    assert r.written() == frozenset({1})


def test_private_and_workgroup_vars_are_not_resources() -> None:
    r = exact(
        X
        + "var<private> seed: u32 = 7u;\nvar<workgroup> tile: array<f32, 64>;\n"
        + "@group(0) @binding(1) var<storage, read_write> y: array<f32>;"
    )
    assert [b.name for b in r.bindings] == ["x", "y"]
    assert r.written() == frozenset({1})


def test_shared_binding_index_across_entry_points() -> None:
    r = exact(
        "@group(0) @binding(0) var<storage, read> a: array<f32>;\n"
        "@group(0) @binding(0) var<storage, read_write> b: array<f32>;\n"
    )
    assert r.group(0)[0].name == "a"  # the first declared
    assert r.written() == frozenset({0})  # but the binding may be written by some entry point


def test_directives_functions_and_const_asserts_are_skipped() -> None:
    r = exact(
        """
        enable f16;
        requires readonly_and_readwrite_storage_textures;
        diagnostic(off, derivative_uniformity);
        ;
        const_assert 2 > 1;
        @group(0) @binding(0) var<storage, read> x: array<f32>;
        @must_use
        fn helper(a: array<f32, 4>, p: ptr<function, i32>) -> @location(0) vec4<f32> {
            var local = 1;  // } a brace in a comment
            /* { another */
            { { let z = select(1, 2, local > 0); } }
            for (var i = 0; i < 4; i++) { if i > 2 { break; } }
            return vec4<f32>(0.0);
        }
        @group(0) @binding(1) var<storage, read_write> y: array<f32>;
        @diagnostic(off, derivative_uniformity) @compute @workgroup_size(8, 8, 1)
        fn main() { y[0] = x[0]; }
        """
    )
    assert r.written() == frozenset({1})


def test_uniform_members_of_a_struct_with_attributes() -> None:
    r = exact(
        """
        struct Params {
            @align(16) a: f32,
            @size(8) n: u32,
            @location(0) v: vec3 < f32 >,
            m: array<vec4<f32>, 2>
        }
        @group(0) @binding(3) var<uniform> p: Params;
        """
    )
    expected = (Member("a", "f32"), Member("n", "u32"), Member("v", "vec3<f32>"), Member("m", "array<vec4<f32>, 2>"))
    assert r.uniform_members(0, 3) == expected
    assert r.structs["Params"] == expected


def test_uniform_of_a_scalar_type() -> None:
    r = exact(
        """
        alias Count = u32;
        @group(0) @binding(0) var<uniform> n: u32;
        @group(0) @binding(1) var<uniform> c: Count;
        """
    )
    assert r.uniform_members(0, 0) == (Member("n", "u32"),)
    assert r.uniform_members(0, 1) == (Member("c", "u32"),)


def test_uniform_behind_an_alias_cycle() -> None:
    r = inexact("alias A = B;\nalias B = A;\n@group(0) @binding(0) var<uniform> p: A;")
    assert any("cannot resolve alias" in p for p in r.problems)
    assert r.uniform_members(0, 0) is None


def test_uniform_of_another_type_has_no_members() -> None:
    r = exact("@group(0) @binding(0) var<uniform> v: vec4<f32>;\n@group(0) @binding(1) var<uniform> u: Undeclared;")
    assert r.uniform_members(0, 0) is None
    assert r.uniform_members(0, 1) is None


def test_structs_declared_after_use_and_aliases() -> None:
    r = exact(
        """
        @group(0) @binding(0) var<uniform> p: Params;
        @group(0) @binding(1) var<uniform> q: P;
        alias Params = P;
        alias Real = f32;
        struct P { a: Real, inner: Inner, }
        struct Inner { x: u32 }
        """
    )
    assert r.bindings[0].type == "Params"
    members = (Member("a", "f32"), Member("inner", "Inner"))
    assert r.uniform_members(0, 0) == members
    assert r.uniform_members(0, 1) == members
    assert dict(r.structs) == {"P": members, "Inner": (Member("x", "u32"),)}


GARBAGE = [
    "",
    "   \n\t",
    "@",
    "@(",
    "@group(",
    "var<",
    "var<storage",
    "struct",
    "struct S {",
    "fn f(",
    "}}}}",
    "/*",
    "*/",
    "// only a comment",
    "\x00\x01\x02",
    "\ufeff@group(0) @binding(0) var<storage> x: array<f32>;",
    "const A = ;",
    "alias = ;",
    "@group(0) @binding(0) var<storage> : ;",
    "@group(0) @binding(0) var<storage>;",
    "@group(0) @binding(0x) var<storage> x: array<f32>;",
    "@group(0) @binding(99999999999999999999999999999999999) var<storage> x: array<f32>;",
    "@group(0) @binding(0) var<storage> x: array<f32, (>;",
    "@group(0) @binding(0) var<storage> x: array<f32>>;",
    "\u00e9\u00e8 \u2603 \U0001f600",
    "@group(0) @binding(0) var<<<>>> x: y;",
]


@pytest.mark.parametrize("source", GARBAGE)
def test_garbage_never_raises(source: str) -> None:
    r = reflect(source)
    if r.exact:
        assert r.problems == ()
        assert r.written() is not None
    else:
        assert r.problems
        assert r.written() is None


def test_random_token_soup_never_raises() -> None:
    pieces = [
        "@group(0)",
        "@binding(1)",
        "@binding(",
        "(",
        ")",
        "var",
        "<",
        ">",
        "storage",
        "read_write",
        ",",
        ";",
        "{",
        "}",
        "fn",
        "struct",
        "const",
        "A",
        "=",
        "1u",
        "0x",
        "/*",
        "*/",
        "//",
        "\n",
        " ",
        ":",
        "alias",
        "override",
        "-",
        "*",
        "/",
        "%",
        "@",
        "\u2028",
        "\r",
        "$",
        ".5",
        "1.",
        "u32(",
    ]
    rng = random.Random(1234)
    for _ in range(2000):
        source = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60)))
        r = reflect(source)
        assert r.exact == (not r.problems)
        if not r.exact:
            assert r.written() is None


def _big_module(size: int) -> str:
    """A valid-looking module of about `size` characters: many bindings, structs, consts and functions."""
    parts = ["enable f16;\n", "const BASE = 1u;\n"]
    i = 0
    total = 0
    while total < size:
        chunk = (
            f"// binding {i}; scaled in place\n"
            f"struct S{i} {{ @align(16) a: f32, n: u32 }}\n"
            f"const C{i}: u32 = BASE + {i}u;\n"
            f"@group(1) @binding(C{i}) /* /* nested */ */ var<storage, {'read_write' if i % 3 == 0 else 'read'}> "
            f"b{i}: array<f32>;\n"
            f"fn helper{i}(v: vec3<u32>) -> f32 {{\n"
            f"    var acc = 0.0;\n"
            f"    for (var k = 0u; k < {i}u; k++) {{ if (k % 2u == 0u) {{ acc += f32(k) * 0.5; }} }}\n"
            f"    return acc;\n"
            f"}}\n"
        )
        parts.append(chunk)
        total += len(chunk)
        i += 1
    return "".join(parts)


def test_a_one_mebibyte_module_is_reflected_quickly() -> None:
    source = _big_module(1 << 20)
    assert len(source) >= 1 << 20
    start = time.perf_counter()
    r = reflect(source)
    elapsed = time.perf_counter() - start
    assert r.exact, r.problems
    count = len(r.bindings)
    assert count > 1000
    assert r.written(1) == frozenset({1 + i for i in range(count) if i % 3 == 0})
    assert len(r.structs) == count
    assert elapsed < 1.0, f"{elapsed:.2f} s for {len(source)} characters"


PATHOLOGICAL = {
    "open-parentheses": "@group(0) @binding(" + "(" * (1 << 20),
    "nested-parentheses": "@group(0) @binding(" + "(" * 300_000 + "1" + ")" * 300_000 + ") var<storage> x: u32;",
    "unary-minus-chain": "@group(0) @binding(" + "- " * 300_000 + "1) var<storage> x: u32;",
    "nested-comments": "/*" * 300_000 + "*/" * 300_000 + "@group(0) @binding(0) var<storage, read_write> x: u32;",
    "unterminated-nested-comments": "/*" * (1 << 19),
    "const-chain": "".join(f"const C{i} = C{i + 1} + 1;\n" for i in range(40_000))
    + "const C40000 = 0;\n@group(0) @binding(C0) var<storage> x: u32;",
    "nested-templates": "@group(0) @binding(0) var<storage> x: " + "array<" * 200_000 + "f32" + ">" * 200_000 + ";",
    "many-attributes": "@group(0) " * 100_000 + "@binding(0) var<storage> x: u32;",
    "many-problems": "@group(0) @binding(NOPE) var<storage> x: u32;\n" * 20_000,
    "many-bad-characters": "#" * (1 << 20),
    "long-line-comment": "//" + "x" * (1 << 20),
    "long-identifier": "a" * (1 << 20),
    "long-number": "@group(0) @binding(" + "1" * (1 << 20) + ") var<storage> x: u32;",
    "long-function": "fn f() {" + "{" * 200_000 + "}" * 200_000 + "}",
}


@pytest.mark.parametrize("source", list(PATHOLOGICAL.values()), ids=list(PATHOLOGICAL))
def test_pathological_input_is_fast_and_safe(source: str) -> None:
    start = time.perf_counter()
    r = reflect(source)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"{elapsed:.2f} s"  # well under 1 s here; quadratic behaviour would take minutes
    assert r.exact == (not r.problems)
    assert len(r.problems) <= 21
    if not r.exact:
        assert r.written() is None


def test_deeply_nested_parentheses_in_an_attribute() -> None:
    deep = "@group(0) @binding(" + "(" * 100_000 + "1" + ")" * 100_000 + ") var<storage, read> y: array<f32>;"
    r = inexact(X + deep)  # beyond the depth cap: undetermined, but no RecursionError
    assert any("nested too deeply" in p for p in r.problems)
    shallow = "@group(0) @binding(" + "(" * 10 + "1" + ")" * 10 + ") var<storage, read_write> y: array<f32>;"
    assert exact(X + shallow).written() == frozenset({1})


def test_nested_comments_are_counted() -> None:
    # "/* /* */" leaves one comment open, so the declaration is commented out (and the comment unterminated)
    inexact(X + "/* /* */ @group(0) @binding(1) var<storage, read_write> y: array<f32>;")
    r = exact(X + "/* /* */ */ @group(0) @binding(1) var<storage, read_write> y: array<f32>; /*/ */")
    assert r.written() == frozenset({1})


def test_reflection_is_frozen_and_hashable() -> None:
    r = exact(AXPB_WGSL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.exact = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.structs["Params"] = ()  # type: ignore[index]
    assert hash(r) == hash(reflect(AXPB_WGSL))
    assert r == reflect(AXPB_WGSL)
    assert hash(r.bindings[0])


def test_the_reflection_uses_the_standard_library_only() -> None:
    imported: set[str] = set()
    for path in Path(wgsl.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    own = {name for name in imported if name.startswith(f"{wgsl.__name__}.")}
    assert own, "the package's modules import each other by their full names"
    assert {name.split(".")[0] for name in imported - own} <= set(sys.stdlib_module_names) | {"__future__"}, imported
