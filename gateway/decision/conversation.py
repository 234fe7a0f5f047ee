"""A conversation as a System One ``state``: the one text both the terminal's ``/decide`` (the chat
client) and the ``jev`` extension of ``/v1/chat/completions`` ask their questions about. Standard
library only, so the chat client stays light."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def conversation_state(messages: Sequence[dict[str, Any]]) -> str:
    """The conversation as a System One ``state``: one ``Role: content`` line per message (the role
    capitalised: ``User: hi``), joined by newlines; ``""`` for none. ``messages``: OpenAI-style
    ``{"role", "content"}`` dicts with text content."""
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)
