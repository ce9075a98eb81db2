"""edge-serve's page at ``GET /``: try a deployment in a browser, with nothing but the server.

One static file (page.html: plain HTML, CSS and JS, no build step) with what the graph does
written into it as JSON, so the page shows only what this graph serves: a chat (text out,
streamed), its spoken reply (pcm16 deltas played as they come), speech from a given text
(/v1/audio/speech, streamed pcm), a microphone and an image picker where the graph reads
request audio and images. The page is served without the API key (a browser sends none when it
opens a page); it holds nothing of a request, and the requests it makes carry the key typed in.
Its Content-Security-Policy lets it reach this origin only, and run its own script only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, Response

from edgeomni.runtime.serve.server import Server, speakers

SLOT = "{{CAPABILITIES}}"


def capabilities(server: Server, *, max_tokens: int, max_audio_s: float) -> dict[str, Any]:
    """What the graph does, as the page needs it; the same tests the routes make (chat wants
    text out, /v1/audio/speech audio and no text), and the request fields a stage reads
    (``request:audio``, ``request:image``) for media in."""
    reads = {i.request_field for s in server.pipe.graph.stages for i in s.inputs}
    chat = bool(server.texts)
    voices, voice = speakers(server.pipe)
    return {
        "chat": chat,
        "speaks": chat and bool(server.audio),
        "speech": bool(server.audio) and not chat,
        "audio_in": chat and "audio" in reads,
        "image_in": chat and "image" in reads,
        "voices": voices,
        "voice": voice,
        "max_tokens": max_tokens,
        "max_audio_s": max_audio_s,
    }


def render(caps: dict[str, Any]) -> str:
    """page.html with ``caps`` in its JSON block (``<``, ``>`` and ``&`` escaped, so no value
    can close the block)."""
    template = resources.files(__package__).joinpath("page.html").read_text("utf-8")
    data = json.dumps(caps).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return template.replace(SLOT, data, 1)


def policy(html: str) -> str:
    """A Content-Security-Policy for the page: its own inline script (by hash) and styles, and
    requests, images and audio from this origin or made in the page; nothing else."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()}'"
        for code in re.findall(r"<script>(.*?)</script>", html, re.S)
    )
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def page_endpoint(server: Server, *, max_tokens: int,
                  max_audio_s: float) -> Callable[[HttpRequest], Awaitable[Response]]:  # fmt: skip
    """The route's handler: the page is made once (the graph does not change while served)."""
    html = render(capabilities(server, max_tokens=max_tokens, max_audio_s=max_audio_s))
    headers = {"Content-Security-Policy": policy(html), "Cache-Control": "no-cache",
               "X-Content-Type-Options": "nosniff"}  # fmt: skip

    async def page(request: HttpRequest) -> Response:
        return HTMLResponse(html, headers=headers)

    return page
