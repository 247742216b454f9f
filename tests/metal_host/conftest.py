"""Tests of the Apple Metal host's portable parts on Linux: the model views (built with the
system C++ compiler into a small library driven by ctypes) and the Objective-C++ syntax check."""
