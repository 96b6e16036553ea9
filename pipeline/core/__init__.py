"""The sans-IO core: the group tracker (``tracker``) and its parts, what it is told
(``messages``) and what it asks for (``actions``).

Nothing here awaits, reads a stream or starts a thread: ``GroupTracker.handle(message)`` returns
actions and the shells (``pipeline.shells``) carry them out. The core imports no shell
(``tests/test_import_graph.py``).
"""
