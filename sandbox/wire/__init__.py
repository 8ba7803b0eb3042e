"""stockade.sandbox.wire.

What crosses a pipe: the supervisor↔worker protocol, length-prefixed framing, and the zygote's control
messages. Plain msgspec data, imported on both sides.
"""
