"""What translation costs: one chat-completions request, passed through to a chat-completions
upstream and translated to a message-format upstream, by the same gateway build, interleaved.

Two gateways on the defaults (metrics and access lines on), each with one channel of the bench
upstream (bench/upstream.py, which answers both formats): one speaks chat completions, the
other the message format only, so every request to it is read, written in the message format,
and its answer written back. Pinned and measured as bench/run.py measures (wrk's closed loop,
CPU ms a request from /proc); the result goes to bench/RESULTS.md, "Translation".

Usage: .venv/bin/python bench/translation.py [--duration S] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import free_port, no_admin_listeners, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402
from bench.run import HERE, Target, run_wrk, start  # noqa: E402

BODY = '{"model":"bench-model","max_completion_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-key-0123"}
CONCURRENCY = (16, 64)
GATEWAYS = {"passed through (chat channel)": "chat", "translated (message channel)": "messages"}


def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="modelgate-translation-"))
    script = work / "post.lua"
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{BODY}'\n"
        + "".join(f"wrk.headers['{k}'] = '{v}'\n" for k, v in HEADERS.items())
    )
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    procs = [start([sys.executable, str(HERE / "upstream.py"), str(up_port), "20"], 1, work / "upstream.log")]
    wait_port(up_port)
    targets = []
    for name, channel_format in GATEWAYS.items():
        port = free_port()
        config = work / f"{channel_format}.yaml"
        config.write_text(
            f'server: {{listen: "127.0.0.1:{port}", max_in_flight: 4096}}\n'
            "keys: [{name: bench, key: bench-key-0123}]\n"
            f"channels: [{{name: bench, base_url: '{upstream_url}', credential: upstream-key, "
            f"formats: [{channel_format}]}}]\n"
        )
        procs.append(start([sys.executable, "-m", "proxy", "serve", "-c", str(config)], 0, work / f"{port}.log"))
        targets.append(Target(name, f"http://127.0.0.1:{port}", procs[-1].pid))
    try:
        for target in targets:
            wait_port(int(target.url.rsplit(":", 1)[1]))
            run_wrk(target, 16, 2, script, "/v1/chat/completions")  # warm up
            target.rps.clear(), target.p50.clear(), target.p99.clear(), target.cpu_ms.clear()
        for concurrency in CONCURRENCY:
            for _ in range(args.rounds):
                for target in targets:
                    run_wrk(target, concurrency, args.duration, script, "/v1/chat/completions")
                    print(f"{target.name:32} c={concurrency:<3} cpu={target.cpu_ms[concurrency][-1]:.3f}ms", flush=True)
        text = report(targets, args)
        update_section("translation", text)
        print(text)
    finally:
        stop_all(procs, 10)
    return 0


def report(targets: list[Target], args: argparse.Namespace) -> str:
    med = statistics.median
    passed, translated = targets
    lines = [
        "## Translation: chat completions to a message-format upstream, beside the same request passed through",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `.venv/bin/python bench/translation.py "
        f"--duration {args.duration} --rounds {args.rounds}`: one gateway build, two configs (a chat-completions "
        "channel; a message-format channel), interleaved; defaults otherwise (metrics and access lines on). "
        "Medians over rounds; gateways on core 0, wrk and the upstream on core 1.",
        "",
        "| concurrency | target | requests/s | p50 ms | p99 ms | CPU ms/request |",
        "|---|---|---|---|---|---|",
    ]
    for c in CONCURRENCY:
        for t in targets:
            lines.append(
                f"| {c} | {t.name} | {med(t.rps[c]):,.0f} | {med(t.p50[c]):.3f} | {med(t.p99[c]):.3f} | "
                f"{med(t.cpu_ms[c]):.3f} |"
            )
    lines.append("")
    for c in CONCURRENCY:
        ratio = med(translated.cpu_ms[c]) / med(passed.cpu_ms[c])
        rounds = ", ".join(f"{a / b:.2f}x" for a, b in zip(translated.cpu_ms[c], passed.cpu_ms[c]))
        lines.append(
            f"- {c} connections: translated CPU per request {ratio:.2f}x the passed-through's (rounds: {rounds})."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
