"""Shared pytest configuration: hypothesis profiles.

`ci` (selected when CI is set) bounds examples and disables deadlines, since numeric code on a
loaded 2-core machine has no stable timing; `dev` runs longer locally.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the long mutation-fuzzing campaign (tests/test_fuzz.py; also HYPOTHESIS_PROFILE=dev)")
