"""`GET /v1/models`: one path that three SDKs call, each with its own key place and its own shape.

The response SDK sends its key as a Bearer token, the message SDK in `x-api-key` (with
`anthropic-version`), the content-generation SDK (API version v1) in `x-goog-api-key`. Every one
of those places is read (and two different keys refused), and the list, and any error, is
answered in the shape of the format whose place held the key (proxy/request/gateway.py sets it before
the pipeline runs).
"""

from __future__ import annotations

from multidict import CIMultiDictProxy

from proxy.formats.base import Format, KeyLocation


class ModelsFormat(Format):
    name = "models"
    key_location = KeyLocation.BEARER
    sdk_key_locations = (KeyLocation.X_API_KEY, KeyLocation.GOOG_API_KEY, KeyLocation.QUERY)

    def __init__(self, messages: Format, content: Format) -> None:
        self._messages = messages
        self._content = content

    def shape_for(self, headers: CIMultiDictProxy[str], query_keys: list[str]) -> Format:
        """The format whose SDK asked: told by where its key (or its version header) came. (Keys
        are read, and compared, in every place this route reads: plugins/auth.py.)"""

        def sent(name: str) -> bool:
            return any(headers.getall(name, []))

        if sent("x-api-key") or sent("anthropic-version") or sent("msgapi-version"):
            return self._messages
        if sent("x-goog-api-key") or query_keys:
            return self._content
        return self
