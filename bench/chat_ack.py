"""Slack's 3-second rule: how fast the chat function acks a signed /ws command (prints JSON).

Starts a private local stack (null runtime) on free ports, sends one cold request (the
function host builds the chat app and its clients on first use), then N signed slash
commands one after another over loopback, exactly as Slack sends them (form body, v0
signature, timestamp), and times each POST until the ack is back. The commands rotate over
the four paths of the function: help (no I/O), list and status (catalog + Firestore reads),
and create (reads, the request record, one publish; the lifecycle and the notifier then
run in the same host, as they would compete for the machine in production).

    .venv/bin/python bench/chat_ack.py [--count 500]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from common import private_stack, summary

from stack.chat import ChatClient, new_trigger_id

COMMANDS = ("help", "list", "status bench-0", "create bench-{i} --profile cpu-small")






def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    began = time.monotonic()
    with private_stack() as (settings, _):
        up_seconds = time.monotonic() - began
        client = ChatClient(settings)
        cold = client.send("create bench-0 --profile cpu-small", user="U0ALICE")
        assert cold.status == 200, cold.body
        by_command: dict[str, list[float]] = {c.split()[0]: [] for c in COMMANDS}
        failures = 0
        for i in range(args.count):
            template = COMMANDS[i % len(COMMANDS)]
            text = template.format(i=i + 1)
            body = client.body(text, user="U0ALICE", trigger_id=new_trigger_id(),
                               response_id=uuid.uuid4().hex)
            start = time.perf_counter()
            response = client.post(body)
            elapsed = (time.perf_counter() - start) * 1000
            if response.status_code != 200 or "_request `slack-" not in response.text:
                failures += 1
            by_command[template.split()[0]].append(elapsed)
        every = [ms for values in by_command.values() for ms in values]
        print(json.dumps({
            "requests": args.count,
            "failures": failures,
            "stack_up_seconds": round(up_seconds, 1),
            "cold_first_ack_ms": round(cold.seconds * 1000, 1),
            "ack_ms": summary(every),
            "by_command_ms": {k: summary(v) for k, v in by_command.items()},
            "over_3s": sum(ms > 3000 for ms in every),
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }, indent=2))


if __name__ == "__main__":
    main()
