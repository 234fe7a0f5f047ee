"""OpenAI's API (``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``), in the
shape serving stacks give each API (vLLM's ``entrypoints/openai``): ``protocol`` (the wire: the
request's fields, the choices, chunks and logprobs of the reply), ``serving`` (each request:
the engine's generation or read-out, whole or streamed), ``routes`` (the paths on the app's router).
"""
