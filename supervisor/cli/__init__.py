"""stockade.supervisor.cli.

The `stockade` command line: the parser, exit codes, one module per command, and what is printed. The
only room that prints; it uses the library, the library never imports it.
"""

from stockade.supervisor.cli.app import main

__all__ = ["main"]
