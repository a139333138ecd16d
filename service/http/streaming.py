"""A generation as server-sent events: incremental decoding at the edge (docs/design.md §5).

The decoder reports token ids per step; text is decoded here, on the event loop, so that
- no delta splits a character: a token may end inside a UTF-8 sequence (byte-level BPE), and
  the tokenizer then decodes the incomplete tail as U+FFFD; such a tail is held back until
  later tokens complete it;
- the deltas concatenate to exactly the non-streamed text, ``tokenizer.decode(all ids)``: each
  delta is the growth of the decoded prefix, and the final flush emits whatever remains.

Trailing whitespace is held back too: tokenizers with clean-up rules (" ," -> ",") rewrite it
depending on the next token. With both rules each emitted prefix stays a prefix of the final
text (checked; a tokenizer that breaks it only delays text to the final flush, never changes it).

Events (``text/event-stream``): ``start`` (key id, nonce, method), ``delta`` (``text`` and the
step's ``token_ids``), then ``done`` (the whole response, as the non-streamed call returns it)
or ``error`` (a problem+json object).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_HELD_AT_END = "\ufffd"


def decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of a completion's ids (a Hugging Face tokenizer's ``decode``), special tokens
    kept, as ``sampler.completion`` does."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


class IncrementalDecoder:
    """Text deltas of a growing id sequence that never split a character (module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = ""

    @property
    def text(self) -> str:
        """The text emitted so far (all of it after ``finish``)."""
        return self._emitted

    def _decode(self) -> str:
        return decode_text(self._tokenizer, self._ids)

    def push(self, ids: Sequence[int]) -> str:
        """Add a step's ids; the new text that is safe to show (may be ``""``)."""
        self._ids.extend(ids)
        text = self._decode()
        stable = text.rstrip(_HELD_AT_END).rstrip()
        if len(stable) <= len(self._emitted) or not stable.startswith(self._emitted):
            return ""
        delta = stable[len(self._emitted) :]
        self._emitted = stable
        return delta

    def finish(self) -> str:
        """The rest of the text, once no more ids come."""
        text = self._decode()
        if not text.startswith(self._emitted):  # pragma: no cover - prevented by push()
            raise AssertionError("streamed text is not a prefix of the final text")
        delta = text[len(self._emitted) :]
        self._emitted = text
        return delta


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event; ``data`` as one line of JSON (no NaN/Infinity)."""
    payload = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode()


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that notices a client disconnect at once.

    Starlette stops listening for ``http.disconnect`` under ASGI spec 2.4 and relies on the
    next write failing; a generation between steps may not write for a while. This always
    listens, cancels the stream when the client goes, and then runs ``on_close`` (e.g. cancel
    the job) — also after a normal end, where cancelling a finished job is a no-op.
    """

    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], None] | None = None
    ) -> None:
        super().__init__(
            content,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    await self.listen_for_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            if self._on_close is not None:
                self._on_close()
