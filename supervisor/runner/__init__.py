"""stockade.supervisor.runner.

The session-runner library: the façade (`SessionRunner`), the loop, the stream with its reconnect
backoff, the view (a pure fold), the gate, running calls, results, posting, retry, records and the
journal.
"""
