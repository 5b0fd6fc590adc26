"""``refinery serve``: a FastAPI service and a static dashboard over run directories.

``app`` (routes, ``create_app``, ``serve``), ``runs`` (admission, queue, run processes),
``auth`` (token, allowed roots), ``sql_guard`` (read-only DuckDB), ``static/`` (the page).
"""
