"""stockade.supervisor.adapters.

Adapters of the sandbox to other SDK runners: the Messages API tool runner (`sandboxed`).
"""
