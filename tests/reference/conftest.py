"""Fixtures of the reference tests: tensor builders and seeded synthetic models (built once)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from ds4.reference.weights import Tensor


def _f32_tensor(name: str, values) -> Tensor:
    v = np.ascontiguousarray(values, dtype=np.float32)
    return Tensor(name, GGMLQuantizationType.F32, tuple(reversed(v.shape)), v)


@pytest.fixture(scope="session")
def f32_tensor():
    """Builder of an F32 :class:`Tensor` holding ``values`` (numpy layout: reversed ggml dims)."""
    return _f32_tensor
