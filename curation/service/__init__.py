"""``refinery serve``: a FastAPI service and a static dashboard over run directories.

``app`` (``create_app``, ``serve``), ``routes/`` (one module per area: pages, runs, inspect,
browse, evals), ``state`` (what the routes share), ``middleware`` (token, size limit, headers,
stage-module allow-list), ``models`` (response models), ``stats`` (stats payload and caches),
``runs`` (admission, queue, run processes), ``auth`` (token, allowed roots), ``browse`` (the
document browser), ``sql_guard`` (read-only DuckDB), ``sql_box`` (each /sql query in a
killed-at-deadline, memory-capped child), ``static/`` (the page).
"""
