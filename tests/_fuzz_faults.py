"""Deliberately bad case bodies that prove tests/_fuzz.py classifies every failure."""

import ctypes


def foreign():
    raise TypeError("a foreign exception")


def crash():
    ctypes.string_at(0)   # SIGSEGV


def allocate_too_much():
    return bytearray(8 << 30)   # over the 3 GiB address-space limit


def ds4_error():
    from ds4.errors import CacheFormatError
    raise CacheFormatError("refused on purpose")
