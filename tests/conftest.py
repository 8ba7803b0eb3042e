"""Suite-wide fixtures. Every test has a timeout (pyproject: `timeout`), so every wait is bounded."""
