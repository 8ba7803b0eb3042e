"""A tool module that raises while it is imported."""

raise RuntimeError("boom at import")
