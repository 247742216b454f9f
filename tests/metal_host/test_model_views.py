"""csrc/backend/metal/model_views.cpp against a fake Metal device with a tiny page and max buffer
length: over random file layouts (tensor sizes, gaps, a mapping that does not start on a page),
every tensor lies wholly inside the view `locate` names, at the right address; views are
page-aligned, whole pages, within the max length, cover the mapping, and wrap it without a copy;
a tensor too large for any view is refused with a message naming the limits."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from _host_build import ROOT, build_shared, host_cxx

U64 = ctypes.c_uint64
P64 = ctypes.POINTER(ctypes.c_uint64)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if host_cxx() is None:
        pytest.skip("no C++ compiler on PATH to build the model-views driver (set CXX)")
    out = tmp_path_factory.mktemp("views") / "libviews.so"
    build_shared([ROOT / "csrc/backend/metal/model_views.cpp", ROOT / "tests/metal_host/model_views_driver.cpp"], out)
    so = ctypes.CDLL(str(out))
    so.views_build.argtypes = [U64, U64, U64, U64, U64, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
    so.views_free.argtypes = [ctypes.c_void_p]
    for f in (so.views_count, so.views_copies, so.views_wraps):
        f.argtypes = [ctypes.c_void_p]
    so.views_view.argtypes = [ctypes.c_void_p, ctypes.c_int, P64, P64, P64, P64]
    so.views_locate.argtypes = [ctypes.c_void_p, U64, U64, ctypes.c_int, P64, P64, P64, ctypes.c_char_p,
                                ctypes.c_size_t]
    return so


class Views:
    def __init__(self, lib, base, size, largest, page, max_len):
        self.lib, self.base, self.size, self.page, self.max_len = lib, base, size, page, max_len
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        if lib.views_build(base, size, largest, page, max_len, ctypes.byref(h), err, 1024):
            raise ValueError(err.value.decode())
        self.h = h

    def close(self):
        self.lib.views_free(self.h)

    def views(self):
        out = []
        for k in range(self.lib.views_count(self.h)):
            v = [U64() for _ in range(4)]
            self.lib.views_view(self.h, k, *map(ctypes.byref, v))
            out.append(tuple(x.value for x in v))   # wrap_ptr, wrap_bytes, contents, length
        return out

    def locate(self, offset, nbytes, by_address=False):
        v, c, o = U64(), U64(), U64()
        err = ctypes.create_string_buffer(1024)
        if self.lib.views_locate(self.h, offset, nbytes, int(by_address), ctypes.byref(v), ctypes.byref(c),
                                 ctypes.byref(o), err, 1024):
            raise ValueError(err.value.decode())
        return v.value, c.value, o.value


def check_location(views, base, offset, nbytes, loc):
    """The located view holds the whole tensor and the view offset addresses its first byte."""
    k, contents, in_view = loc
    wrap_ptr, _, view_contents, length = views[k]
    assert contents == view_contents == wrap_ptr
    assert contents + in_view == base + offset
    assert in_view + nbytes <= length


def check_views(views, base, size, page, max_len):
    assert views, "a non-empty mapping has at least one view"
    first = base - base % page
    for k, (ptr, nbytes, contents, length) in enumerate(views):
        assert contents == ptr and length == nbytes, "a view reports the memory it wraps (no copy)"
        assert ptr % page == 0 and nbytes % page == 0 and 0 < nbytes <= max_len
        if k:
            assert views[k - 1][0] < ptr <= views[k - 1][0] + views[k - 1][1], "views are ordered and leave no gap"
    assert views[0][0] == first
    last = views[-1]
    assert last[0] + last[1] >= base + size and last[0] + last[1] - (base + size) < page, "whole pages only"


layouts = st.fixed_dictionaries({
    "page": st.sampled_from([16, 64, 256, 48]),        # 48: the arithmetic needs no power of two
    "max_pages": st.integers(1, 12),
    "max_extra": st.integers(0, 15),                     # a max length that is not whole pages
    "lead": st.integers(0, 255),                         # the mapping's start within its page
    "header": st.integers(0, 300),
    # (gap before, size in hundredths of a page): tensors of up to 4 pages
    "tensors": st.lists(st.tuples(st.integers(0, 40), st.integers(1, 400)), min_size=1, max_size=30),
    "tail": st.integers(0, 100),
})


@given(layouts)
def test_every_tensor_in_one_view(lib, lay):
    page = lay["page"]
    max_len = page * lay["max_pages"] + lay["max_extra"] % page
    base = page * 1000 + lay["lead"] % page
    spans, at = [], lay["header"]
    for gap, hundredths in lay["tensors"]:
        n = max(1, hundredths * page // 100)
        at += gap
        spans.append((at, n))
        at += n
    size = at + lay["tail"]
    largest = max(n for _, n in spans)
    longest = max_len // page * page
    first = base - base % page
    span = -(-(base + size) // page) * page - first
    fits_one_view = span <= longest
    guaranteed = fits_one_view or -(-largest // page) * page < longest
    try:
        v = Views(lib, base, size, largest, page, max_len)
    except ValueError as e:
        assert not guaranteed, f"refused a layout the views can hold: {e}"
        assert str(max_len) in str(e) and f"page size {page}" in str(e) and str(largest) in str(e)
        event("refused: tensor too large for a view")
        return
    try:
        assert guaranteed, "accepted a tensor larger than a view can guarantee"
        views = v.views()
        event("one view" if len(views) == 1 else "several views")
        check_views(views, base, size, page, max_len)
        assert lib.views_copies(v.h) == 0 and lib.views_wraps(v.h) == len(views)
        for off, n in spans:
            check_location(views, base, off, n, v.locate(off, n))
            check_location(views, base, off, n, v.locate(off, n, by_address=True))
    finally:
        v.close()


def test_location_check_catches_a_wrong_view(lib):
    """The property above fails when locate names a view that misses the tensor's tail."""
    v = Views(lib, 4096, 1000, 100, 64, 256)
    try:
        views = v.views()
        assert len(views) > 2
        off, n = 600, 100
        k, c, o = v.locate(off, n)
        check_location(views, 4096, off, n, (k, c, o))
        wrong = k - 1
        bad = (wrong, views[wrong][0], 4096 + off - views[wrong][0])
        with pytest.raises(AssertionError):
            check_location(views, 4096, off, n, bad)
    finally:
        v.close()


def test_under_declared_largest_tensor_is_refused_not_straddled(lib):
    """Overlap planned for 64-byte tensors: a 200-byte range crossing a view end is an error."""
    page, max_len = 64, 256
    v = Views(lib, 8192, 2000, 64, page, max_len)
    try:
        views = v.views()
        stride = views[1][0] - views[0][0]
        assert stride == max_len - page
        with pytest.raises(ValueError, match="straddles two views"):
            v.locate(stride - 10, 200)
        with pytest.raises(ValueError, match="outside the mapped model"):
            v.locate(1990, 20)
    finally:
        v.close()


def test_tensor_larger_than_max_buffer_length_names_the_limits(lib):
    page, max_len = 16384, 16384 * 4
    with pytest.raises(ValueError) as e:
        Views(lib, 1 << 20, 16384 * 40, 16384 * 5, page, max_len)
    msg = str(e.value)
    assert "max buffer length is 65536 bytes" in msg and "page size 16384" in msg and "81920 bytes" in msg


def test_small_mapping_is_one_view_whatever_the_largest_tensor(lib):
    v = Views(lib, 4096 + 5, 100, 0, 64, 256)
    try:
        assert [(p, n) for p, n, _, _ in v.views()] == [(4096, 128)]
        assert v.locate(0, 100)[2] == 5
    finally:
        v.close()
