"""``desktop-sandbox mcp``: the sandbox's computer tools as an MCP server (docs/mcp.md).

- :mod:`controller.mcp.server` -- the tools, and how a tool call finds its session's sandbox;
- :mod:`controller.mcp.session` -- one MCP session, one sandbox (:class:`McpSession`), the server's
  sessions (:class:`SessionHub`), the options every sandbox starts with (:class:`McpOptions`);
- :mod:`controller.mcp.elicit` -- approvals asked by MCP elicitation;
- :mod:`controller.mcp.http` -- streamable HTTP on 127.0.0.1: the bearer key, Host and Origin checks;
- :mod:`controller.mcp.serve` -- the stdio and HTTP serving loops, their signals and their end.

It sits on top beside the command line: it drives sandboxes through :mod:`desktop_sandbox` and nothing
of ``controller/`` imports it but ``controller.commands.mcp``.
"""
