"""The in-child launcher of the `namespaces` and `landlock` backends (a separate program).

The server runs it as `python -S -E -s -B -c <bootstrap>` (see `cairn.sandbox._launch`): a
fresh interpreter without site-packages, so every module here uses the standard library
only, imports its siblings relatively, and never imports the rest of Cairn. It confines
itself step by step with system calls (Python 3.11's `os` lacks most of them) and finally
execs the command; keeping these steps out of the server means no Python code runs in a
forked copy of the threaded server.
"""
