"""The work of each ``desktop-sandbox`` command, one module a command (or two close ones).

:mod:`controller.cli` parses the command line (options, help text) and hands the values to a function
here: ``build``, ``up``, ``down``, ``run_task``, ``report``, ``audit``, ``run_suite``, ``render`` and
``servers`` (``console``, ``serve``). What they share, the one console on stderr, its refusal and error
lines and the backend lookups, is :mod:`controller.commands.common`.
"""
