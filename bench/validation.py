"""The validation plugin's cost per format, for a typical body of each (the JSON is parsed already,
as it is in the gateway). Target: under 100 us at p50.

Usage: .venv/bin/python bench/validation.py [--iterations N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.results import update_section  # noqa: E402
from proxy.schemas import JSON_SCHEMAS, check  # noqa: E402

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
TYPICAL = {
    "messages": {
        "model": "msgmodel-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are terse.",
        "temperature": 0.7,
        "tools": [
            {
                "name": "get_weather",
                "description": "weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }
        ],
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C, clear"}]},
        ],
    },
    "generate_content": {
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "Describe this image."}, {"inlineData": {"mimeType": "image/png", "data": PNG}}],
            }
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"temperature": 0.4, "maxOutputTokens": 512, "stopSequences": ["END"]},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}],
    },
    "responses": {
        "model": "respmodel-4o",
        "instructions": "Be brief.",
        "temperature": 0.5,
        "metadata": {"team": "search"},
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Summarise the report."}]}],
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    "image_generations": {
        "model": "imagegen-2.5-sunburst",
        "prompt": "A lighthouse at dusk, oil painting",
        "size": "1536x1024",
        "quality": "high",
        "n": 2,
        "output_format": "webp",
    },
    "video_generations": {
        "model": "videogen-3.0-generate-001",
        "prompt": "Waves on a beach at sunset",
        "metadata": {"durationSeconds": 8, "aspectRatio": "16:9", "resolution": "1080p"},
    },
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    rows = [
        "## Validation cost per format",
        "",
        f"The validation plugin's check of a typical body (already parsed), {args.iterations:,} runs each, "
        f"Python {sys.version.split()[0]}; `.venv/bin/python bench/validation.py`. Target: under 100 us at p50.",
        "",
        "| route | p50 us | p99 us |",
        "|---|---|---|",
    ]
    for route, body in TYPICAL.items():
        schema = JSON_SCHEMAS[route]
        _, violation = check(schema, body)
        assert violation is None, (route, violation)
        samples = []
        for _ in range(args.iterations):
            started = time.perf_counter_ns()
            check(schema, body)
            samples.append(time.perf_counter_ns() - started)
        samples.sort()
        p50, p99 = statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000
        rows.append(f"| {route} | {p50:.1f} | {p99:.1f} |")
        print(f"{route:20} p50={p50:6.1f}us p99={p99:6.1f}us")
    update_section("validation", "\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
