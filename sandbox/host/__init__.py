"""stockade.sandbox.host.

The supervisor side of the sandbox: warm pools (`Sandbox`), the handle on one worker, the zygote client,
import paths, call outcomes and worker errors.
"""
