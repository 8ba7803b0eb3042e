"""stockade.supervisor.environments.

`stockade serve`'s engine: polling a self-hosted environment's work queue, a work item's lease, and
serving one item with a `SessionRunner`.
"""
