"""Reviewing a finished run: ``desktop-sandbox report runs/<id> --html`` writes ``runs/<id>/report.html``.

:mod:`controller.report.html` renders the page (:func:`render_report`, :func:`write_report`);
:mod:`controller.report.steps` groups the record's entries into steps, and draws each step's actions over
its screenshot (SVG, model px) by the geometry of :mod:`controller.model.marks`; the run's video, when it
has one, is played from beside the page. Templates ship as package data (``templates/``).
"""

from controller.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
