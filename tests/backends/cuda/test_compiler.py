"""CUDA source checks and the kernel interface read from the source: pure Python, no GPU and no
cuda-python needed."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from gpud.backends.cuda import check_flags, check_source, parse_parameters, scalar_kinds, written_tensors
from gpud.backends.cuda.compiler import OneBuild, interface
from gpud_protocol.errors import InvalidArgument

SCALE = """
// y = a * x
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;  /* one thread per element */
    if (i < n) y[i] = a * x[i];
}
"""


def params(source: str, entry: str) -> list[str] | None:
    return parse_parameters(check_source(source), entry)


def test_importable_without_cuda_python() -> None:
    code = "import sys, gpud.backends.cuda.compiler; assert 'cuda.bindings' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- check_source


def test_plain_kernel_passes_with_comments_blanked() -> None:
    stripped = check_source(SCALE)
    assert "y = a * x" not in stripped
    assert "one thread per element" not in stripped
    assert 'extern "C" __global__ void scale(' in stripped


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("#include <stdio.h>\n", "includes"),
        ("  #  include </etc/passwd>\n", "includes"),
        ("%:include </etc/passwd>\n", "includes"),
        ("#include_next <x.h>\n", "includes"),
        ("#inc\\\nlude </etc/passwd>\n", "includes"),  # hidden by a line splice
        ("#/* a comment */include </etc/passwd>\n", "includes"),
        ("#if __has_include(</etc/passwd>)\n#endif\n", "__has_include"),
        ("??=include </etc/passwd>\n", "trigraphs"),
        ('const char* s = R"(\n#include </etc/passwd>\n)";\n', "raw string"),
        ('const char* s = u8R"x(a)x";\n', "raw string"),
        ("\\u0023include </etc/passwd>\n", "universal character names"),
    ],
)
def test_refused_sources(source: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        check_source(source)


def test_identifiers_ending_in_r_are_not_raw_strings() -> None:
    check_source('__device__ const char* FOOR = "x"; __device__ int uR = 1;\n')


# ---------------------------------------------------------------------------- check_flags


@pytest.mark.parametrize(
    "flag",
    ["-DN=4", "-DDEBUG", "-DX=1.5", "--use_fast_math", "-use_fast_math", "--fmad=false", "-lineinfo", "--std=c++17"],
)
def test_allowed_flags(flag: str) -> None:
    assert check_flags([flag]) == [flag.encode()]


@pytest.mark.parametrize(
    "flag", ["-I/etc", "--include-path=/etc", "-include", "/etc/passwd", "-DX=$(id)", "-DA;B", "--fmad=maybe", ""]
)
def test_refused_flags(flag: str) -> None:
    with pytest.raises(InvalidArgument, match="not allowed"):
        check_flags(["-DOK", flag])


# ---------------------------------------------------------------------------- parse_parameters


def test_parameters_of_the_entry() -> None:
    assert params(SCALE, "scale") == ["const float* x", "float* y", "float a", "unsigned int n"]


def test_parameters_skip_non_kernel_functions_and_comments() -> None:
    source = """
    __device__ float scale(float v) { return v; }
    extern "C" __global__ void /* (int bogus) */ scale(float* y, int n) { y[0] = ::scale(1.0f); }
    """
    assert params(source, "scale") == ["float* y", "int n"]


def test_parameters_empty_and_void() -> None:
    assert params('extern "C" __global__ void k() {}', "k") == []
    assert params('extern "C" __global__ void k(void) {}', "k") == []


def test_parameters_unknown() -> None:
    assert params('extern "C" __global__ void k(float* y) {}', "other") is None
    assert params("template <typename T> __global__ void k(T* y, Foo<T> f) {}", "k") is None
    assert params('#define KERNEL(name) extern "C" __global__ void name(float* y)\nKERNEL(k) {}', "k") is None


# ---------------------------------------------------------------------------- written_tensors


def test_written_tensors() -> None:
    parameters = [
        "const float* x",
        "float* y",
        "float a",
        "float const* z",
        "float* const w",
        "float v[]",
        "const int u[]",
    ]
    assert written_tensors(parameters) == frozenset({1, 3, 4})
    assert written_tensors(["float a"]) == frozenset()


def test_written_tensors_restrict() -> None:
    assert written_tensors(["const float* __restrict__ x", "float* __restrict__ y"]) == frozenset({1})


# ---------------------------------------------------------------------------- scalar_kinds


def test_scalar_kinds_in_order_skipping_pointers() -> None:
    assert scalar_kinds(["const float* x", "float* y", "float a", "unsigned int n"]) == ("f32", "u32")
    assert scalar_kinds(["float a", "int b", "unsigned n", "float* y"]) == ("f32", "i32", "u32")
    assert scalar_kinds(["float* y", "float v[]"]) == ()
    assert scalar_kinds([]) == ()


@pytest.mark.parametrize(
    ("parameter", "kind"),
    [
        ("float a", "f32"),
        ("const float a", "f32"),
        ("float const a", "f32"),
        ("float __restrict__ a", "f32"),
        ("int n", "i32"),
        ("int32_t n", "i32"),
        ("signed n", "i32"),
        ("signed int n", "i32"),
        ("const  int\n n", "i32"),
        ("unsigned n", "u32"),
        ("unsigned int n", "u32"),
        ("uint32_t n", "u32"),
        ("float", "f32"),  # unnamed
        ("unsigned int", "u32"),  # unnamed
        ("int n = 3", "i32"),  # a default argument
    ],
)
def test_scalar_kind_of_each_type(parameter: str, kind: str) -> None:
    assert scalar_kinds(["float* y", parameter]) == (kind,)


@pytest.mark.parametrize(
    "parameter",
    [
        "double d",
        "__half h",
        "long n",
        "unsigned long n",
        "long long n",
        "short s",
        "char c",
        "bool b",
        "size_t n",
        "int64_t n",
        "float2 v",
        "Params p",
        "__grid_constant__ const Params p",
        "float& r",
        "std::uint32_t n",
        "int unsigned",
    ],
)
def test_scalar_kinds_unknown_type(parameter: str) -> None:
    assert scalar_kinds(["float a", parameter, "int n"]) is None


# ---------------------------------------------------------------------------- interface


def test_interface_from_the_source() -> None:
    tensors, scalars, writes, unchecked = interface(params(SCALE, "scale"), None, True)
    assert (tensors, scalars, writes) == (2, ("f32", "u32"), frozenset({1}))
    assert unchecked == ("CUDA C can cast const away: read-only guards against mistakes only",)


def test_interface_declared_writes_win() -> None:
    _, _, writes, _ = interface(params(SCALE, "scale"), (0, 1), True)
    assert writes == frozenset({0, 1})


def test_interface_unknown_parameters() -> None:
    tensors, scalars, writes, unchecked = interface(None, None, False)
    assert (tensors, scalars, writes) == (None, None, None)
    assert any("parameter list" in u for u in unchecked)
    assert any("argument sizes" in u for u in unchecked)
    assert any("every tensor argument counts as written" in u for u in unchecked)


def test_interface_other_scalar_types() -> None:
    tensors, scalars, writes, unchecked = interface(["float* y", "double d"], None, True)
    assert (tensors, scalars, writes) == (1, None, frozenset({0}))
    assert any("scalar kinds are not checked" in u for u in unchecked)


def test_interface_no_tensors() -> None:
    assert interface(["int n"], None, True) == (0, ("i32",), frozenset(), ())


def test_a_tensor_map_parameter_is_a_tensor_read() -> None:
    """The library's TMA kernels take x and w as tensor maps: tensors, read, like const pointers."""
    source = """
struct alignas(64) TmaMap { unsigned long long v[16]; };
extern "C" __global__ void mm(const __grid_constant__ TmaMap tx, const __grid_constant__ TmaMap tw,
    const void* bias, unsigned short* out, unsigned int m, float s) {}
"""
    tensors, scalars, writes, _ = interface(params(source, "mm"), None, True)
    assert (tensors, scalars, writes) == (4, ("u32", "f32"), frozenset({3}))


def test_one_build_of_an_image_at_a_time() -> None:
    """Threads asking for one image: the first builds it, the others wait for it; other images in parallel."""
    builds = OneBuild()
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with builds.of(("family",)):
            order.append("first builds")
            started.set()
            release.wait(5)
            order.append("first built")

    def second() -> None:
        started.wait(5)
        with builds.of(("family",)):
            order.append("second loads")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    started.wait(5)
    with builds.of(("another family",)):  # not held up by the first build
        order.append("another builds")
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == ["first builds", "another builds", "first built", "second loads"]
    assert not builds._building  # only images being built are held
