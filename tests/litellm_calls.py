"""Run by tests/test_sdks.py under its own Python (.venv-litellm): litellm as a client of the gateway,
through its anthropic/, gemini/ and openai/ (chat completions, and responses) providers. Prints one JSON line per call."""

from __future__ import annotations

import json
import sys

import litellm

BASE, KEY = sys.argv[1], sys.argv[2]
MESSAGES = [{"role": "user", "content": "Hello"}]


def report(call: str, fn) -> None:
    try:
        print(json.dumps({"call": call, "ok": True, "text": fn()}))
    except Exception as exc:  # every failure is reported, the next call still runs
        print(json.dumps({"call": call, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}))


def completion(model: str, api_base: str, stream: bool) -> str:
    answer = litellm.completion(
        model=model, api_base=api_base, api_key=KEY, messages=MESSAGES, max_tokens=32, stream=stream
    )
    if stream:
        return "".join(chunk.choices[0].delta.content or "" for chunk in answer)
    return answer.choices[0].message.content


def responses(stream: bool) -> str:
    answer = litellm.responses(
        model="openai/respmodel-4o", api_base=BASE + "/v1", api_key=KEY, input="Hello", stream=stream
    )
    if stream:
        return next(
            event.response.output[0].content[0].text
            for event in answer
            if str(event.type).endswith("response.completed") or event.type == "response.completed"
        )
    return answer.output[0].content[0].text


for stream in (False, True):
    suffix = " stream" if stream else ""
    report("anthropic/" + suffix, lambda stream=stream: completion("anthropic/msgmodel-sonnet-4-5", BASE, stream))
    report("gemini/" + suffix, lambda stream=stream: completion("gemini/genmodel-2.0-flash", BASE + "/v1beta", stream))
    report("openai/ responses" + suffix, lambda stream=stream: responses(stream))
    report("openai/" + suffix, lambda stream=stream: completion("openai/respmodel-4o", BASE + "/v1", stream))
