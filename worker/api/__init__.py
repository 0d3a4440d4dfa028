"""``compactor serve``: the HTTP API under ``/v1``, health and metrics, and the proxy.

Starlette on uvicorn (the ``http`` extra). docs/http.md is the reference and ``openapi.json``
beside this module the spec, shipped with the package (:mod:`worker.api.spec`; docs/openapi.json
is its copy).
"""
