import pytest

import ds4
from ds4 import errors


@pytest.mark.parametrize(
    "name",
    ["ModelFormatError", "UnsupportedModelError", "ContextOverflowError", "CacheFormatError",
     "InvalidArgumentError", "TokenizerError", "CancelledError", "Ds4IOError"],
)
def test_every_error_is_a_ds4error(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.Ds4Error)
    with pytest.raises(errors.Ds4Error):
        raise cls("x")


def test_top_level_reexports():
    assert ds4.ModelFormatError is errors.ModelFormatError
    assert ds4.ContextOverflowError is errors.ContextOverflowError
