"""The ``trainjob-admission`` command: ``main`` (the parser, review and policy), ``commands``
(serve, demo, decisions, certs), ``settings`` (serve's settings), ``errors`` (exit codes),
``io_habits`` (kubectl's habits), ``demo`` and ``sampledata``. Heavy libraries are imported by the
commands that use them, so ``--help`` and ``review`` start fast.

May import: policies, certs, webhook.
"""
