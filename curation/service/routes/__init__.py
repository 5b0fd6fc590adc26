"""The service's routes, one module per area. Each has ``add_routes(router, state)``, which
declares its routes on a FastAPI ``APIRouter`` over the one ``ServiceState`` that
``create_app`` builds: a function of the state rather than a module-level router, since some
bounds (the SQL row limit) are the operator's settings. ``create_app`` hands them the app's own
router, so ``app.routes`` is the flat route table (an ``include_router``-ed router is one lazy
entry there in FastAPI 0.16x); a test may hand one a fresh ``APIRouter``.

- ``pages``: ``/healthz``, the sign-in form and cookie, the dashboard page, ``/static``, the
  OpenAPI document and ``/docs``;
- ``runs``: submit, list, describe, progress, ``/metrics``, the DAG, cancel, resume;
- ``inspect``: a run's stats and read-only SQL;
- ``browse``: stages, documents, signal histograms;
- ``evals``: the latest ``refinery eval`` report of each stage.
"""
