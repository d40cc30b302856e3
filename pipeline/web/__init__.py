"""The call pages: a call list and one page per call, served by the worker and written as static files.

- ``data``: the pages' reads, read-only SQL through a ``RowSource`` (the worker's checked query path, or
  `callqa report`'s), into typed dataclasses.
- ``timeline``: the geometry of a call's timeline (speech, overtalk, silence, holds, alerts): pure.
- ``render``: Jinja2 templates (``templates/``, autoescaped) to HTML; ``write_site`` for ``report --html``.
- ``views``: the worker's aiohttp handlers (/login, /logout, /calls, /calls/{id}), plugged into the API
  server of ``pipeline.api`` (whose auth, token file and session cookie guard them).

Nothing here needs JavaScript, a build step or the network: styles and SVG are inline in each page.
"""
