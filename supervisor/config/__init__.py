"""stockade.supervisor.config.

Configuration: the policy file (`stockade.toml`), units, environment reads, and the one translation from
a policy file to runner arguments.
"""
