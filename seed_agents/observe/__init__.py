"""Watching a deployed agent: ``seed-agents status``, the gateway's ``/metrics`` and a web report.

``data`` reads the trace store once for all three (versions, decisions, one point per
session, queue lengths); ``curve`` turns rewarded sessions into success per version per
time window (pure); ``status`` renders the terminal screen, ``report`` the HTML page
(``seed-agents report``, and the gateway's ``/dashboard``), ``metrics`` the Prometheus
collectors; ``routes`` puts both endpoints on the gateway; ``testing`` fills a store with a
small demo deployment for tests and the screenshot.
"""
