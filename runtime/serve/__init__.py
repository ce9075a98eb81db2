"""edge-serve: the runtime's graph over OpenAI's API (needs the ``serve`` extra)."""
