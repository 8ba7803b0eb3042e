"""stockade.sandbox.isolation.

The Linux isolation layers: probe, cage, cgroups, process trees and their kill, rlimits, namespaces and
mounts, Landlock, identity and raw syscalls.
"""
