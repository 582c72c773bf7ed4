"""The local web console: a page per run on 127.0.0.1 to watch a run, answer its approvals and take over.

* :mod:`controller.console.server` -- :class:`~controller.console.server.ConsoleServer` (uvicorn in a
  background thread on a free loopback port; ``url`` is the one-time login URL);
* :mod:`controller.console.auth` -- the one-time token, the session cookie, CSRF, Origin and Host checks
  and the security headers of every response (an ASGI wrapper around the app);
* :mod:`controller.console.app` -- the routes; :mod:`controller.console.runs` -- run ids, the runs list
  and recorded screenshots; :mod:`controller.console.streams` -- the event stream (SSE) and the live
  screen (MJPEG).

The console reads the runner's :class:`controller.run.live.LiveRun` and the run records under a runs
directory; the runner never imports it.
"""
