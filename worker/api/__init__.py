"""``compactor serve``: the HTTP API under ``/v1``, health and metrics, and the proxy.

Starlette on uvicorn (the ``http`` extra). docs/http.md is the reference and docs/openapi.json
the spec (:mod:`worker.api.spec`).
"""
