"""The single place jaxdbg's version is written down (read by pyproject.toml and the CLI)."""

__version__ = "0.1.0"
