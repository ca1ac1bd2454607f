"""How fast the two new front doors of agent sandboxes answer (prints JSON).

Starts a private local stack (null runtime: an admitted sandbox is reported at once as
failed to start, so this measures the control plane, not a task) on free ports, then:

- chat: N signed ``/ws sandbox /tmp -- true`` one after another; the ack (Slack's 3 s
  rule: identity, the admission preview on the team's queue and policy, the request record,
  one publish) and the time until the end's notification reaches the Slack sink
  (sandbox.requested -> handler -> runtime -> sandbox.finished -> handler ->
  sandbox.state_changed -> notify_chat_sandbox);
- link: an agent's ``POST <link>/stasis/sandboxes``, answered once the sandbox handler's
  admission is in its ledger (publish, push, one Firestore transaction, the proxy's poll).

    .venv/bin/python bench/sandbox_doors.py [--count 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests
from common import private_stack, summary

from stack.chat import ChatClient, new_trigger_id

ROOT = Path(__file__).resolve().parents[1]




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    with private_stack() as (settings, _):
        client = ChatClient(settings)
        client.send("help", user="U0ALICE")  # the chat app built (cold start excluded)
        acks, notes = [], []
        for _ in range(args.count):
            sent = client.send("sandbox /tmp -- true", user="U0ALICE",
                               trigger_id=new_trigger_id())
            assert sent.status == 200 and "Sandbox `sbx-" in sent.text, sent.text
            acks.append(sent.seconds * 1000)
            began = time.perf_counter() - sent.seconds
            client.outcome(sent, timeout=60, interval=0.02)
            notes.append((time.perf_counter() - began) * 1000)

        env = {**os.environ, "STASIS_USER": "dev"}
        subprocess.run([sys.executable, "-m", "stasis_cli", "ws", "create", "nb", "--team", "ml-a",
                        "--wait"], env=env, check=True, capture_output=True, cwd=ROOT)
        link = requests.post(f"{settings.functions_url}/links/", timeout=30,
                             json={"workspace_id": "ml-a--nb", "scope": "sandbox"},
                             headers={"X-Stasis-User": "dev"}).json()
        base, _, token = link["url"].partition("#")
        agent = requests.Session()
        agent.trust_env = False
        agent.headers["Authorization"] = f"Bearer {token}"
        posts, answered = [], []
        for _ in range(args.count):
            start = time.perf_counter()
            response = agent.post(f"{base}/stasis/sandboxes", timeout=60,
                                  json={"repository": "/tmp", "command": "true"})
            posts.append((time.perf_counter() - start) * 1000)
            answered.append(response.status_code)
            time.sleep(0.1)  # under the link's rate limit (10/s)
        print(json.dumps({
            "chat_ack_ms": summary(acks),
            "chat_request_to_notification_ms": summary(notes),
            "link_post_to_admission_answer_ms": summary(posts),
            "link_statuses": {str(s): answered.count(s) for s in sorted(set(answered))},
            "cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
        }, indent=2))


if __name__ == "__main__":
    main()
