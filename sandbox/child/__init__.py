"""stockade.sandbox.child.

What runs in the zygote and in a worker process. Boots on the standard library and msgspec alone.
"""
