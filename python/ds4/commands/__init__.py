"""Subcommands of the ``ds4`` CLI, one module each, each exposing ``register(subparsers)``."""
