"""Rerank (``POST /v1/rerank``, ``/v2/rerank``, ``/rerank``: Cohere's, Jina's and llama.cpp's shape), in the
shape serving stacks give each API (vLLM's ``entrypoints/openai``): ``protocol`` (the wire: the request's
fields, its 422 and the reply), ``serving`` (each request: parse -> one decision request of a noul per
document -> the ranked reply), ``routes`` (the paths on the app's router). The prompt's wording is the
decision room's (:mod:`gateway.decision.rerank`).
"""
