"""The vocabulary home: the kinds of things the rest of the controller names by string, each kind
defined once, as a table, with its completeness checked when the table is imported.

* :mod:`controller.model.requests` -- approval request kinds (``safety_check``, ``action``,
  ``origin_access``, ``browser_authentication``): per kind the answers it takes, its label on the
  terminal and in the console, its Agents API required action, the request fields only it has.
* :mod:`controller.model.checks` -- task check kinds (``file``, ``sqlite``, ``page``): per kind its
  task-file model; verification registers one runner per kind and is refused at import when one is
  missing or has no kind.
* :mod:`controller.model.errors` -- :class:`DesktopSandboxError`, the base of the project's errors,
  and the vocabulary's own errors.

A name outside a table is an error (:class:`controller.model.errors.UnknownKind`), never a default.
Everything here is pure: no I/O, and nothing imported from ``controller.run``, ``controller.agents_api``
or ``controller.console`` (they import from here).
"""
