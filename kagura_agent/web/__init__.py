"""``kagura-agent web``: a console for runs over the state store, in a browser.

    queries.py   every read of the state store (read-only, bounded pages)
    timeline.py  one run's journal, egress, leases, requests, incidents merged in time
    charts.py    server-rendered SVG charts (cost and turns against the forecast)
    security.py  the one-time login, the session cookie, CSRF, Host and headers
    app.py       the Starlette app: pages rendered by Jinja2 (every value shown as text)
    serve.py     binding and serving it with uvicorn

Starlette and uvicorn (the ``web`` extra) are imported only by this package, and this
package only by ``kagura-agent web``.
"""
