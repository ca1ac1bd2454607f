"""Slack's /ws on the whole local stack, driven as Slack drives it: signed requests to the chat
function (`stasis chat` and the same client in-process), notifications read from the Slack
sink, a real Jupyter kernel whose state is paused and resumed. One module, one stack."""

from __future__ import annotations

import json
import re
import time

import requests

from harness.notebook import Notebook
from stack.chat import ChatClient, new_trigger_id


def _status(stack, name: str) -> dict:
    """The workspace document, with its server's own URL and the local owner's token from
    the node agent (the document's url is the IDE through the access proxy)."""
    doc = stack.workspace(f"ml-a--{name}")
    if doc and doc.get("state") == "RUNNING":
        served = requests.get(f"{stack.settings.node_agent_url}/workspaces/ml-a--{name}",
                              headers=stack.settings.node_agent_headers(), timeout=10).json()
        doc["direct_url"], doc["token"] = served["url"], served["token"]
    return doc


def _chat(client: ChatClient, text: str) -> str:
    """What Slack shows alice for `/ws TEXT`: the ack, then the notification."""
    sent = client.send(text, user="U0ALICE")
    assert sent.status == 200 and f"`{sent.requestid}`" in sent.text
    return sent.text + "\n" + client.outcome(sent, timeout=240)["text"]


def test_create_pause_resume_delete_from_slack(local_stack):
    stack = local_stack
    # `stasis chat` itself once (signing, ack, following the sink), then its client in-process.
    out = stack.cli("chat", "/ws create mynb --profile cpu-small", "--as", "alice",
                    "--timeout", "240").stdout
    assert "Creating mynb for team ml-a: cpu-small" in out and "_request `slack-" in out
    running = re.search(r"mynb is RUNNING in [\d.]+ m?s: (http://127\.0\.0\.1:\d+\S*)", out)
    assert running, out
    info = _status(stack, "mynb")
    assert info["url"] == running.group(1) and info["owner"] == "alice"

    nb = Notebook(info["direct_url"], info["token"])
    kernel = nb.open("chat.ipynb")
    nb.run(kernel, "import numpy as np\nbig = np.arange(2**21, dtype='float64')  # 16 MiB")

    client = ChatClient(stack.settings)
    out = _chat(client, "pause mynb")
    assert "Pausing mynb" in out
    paused = re.search(r"mynb paused — ([\d.]+) (MiB|GiB) in ([\d.]+) (s|ms)\.", out)
    assert paused, out
    size = float(paused.group(1)) * (1024 if paused.group(2) == "GiB" else 1)
    assert size >= 16  # the kernel's array went into the snapshot
    assert _status(stack, "mynb")["state"] == "PAUSED"

    out = _chat(client, "resume mynb")
    assert "mynb resumed: RUNNING again in" in out, out
    info = _status(stack, "mynb")
    nb = Notebook(info["direct_url"], info["token"])
    assert nb.run(nb.open("chat.ipynb"), "print(int(big.sum()))").stdout.strip() == str(
        (2**21 - 1) * 2**21 // 2)

    out = _chat(client, "delete mynb")
    assert "mynb deleted." in out
    assert _status(stack, "mynb")["state"] == "DELETED"
    # Every notification went back through its command's response_url (all within 30 min).
    assert client.messages(kind="chat.postMessage") == []


def test_forged_stale_retried_and_foreign_requests(local_stack):
    stack = local_stack
    client = ChatClient(stack.settings)
    trigger = new_trigger_id()
    body = client.body("create retried --profile cpu-small", user="U0BOB", trigger_id=trigger,
                       response_id="retry-test")
    assert client.post(body, secret="a-guess").status_code == 401
    assert client.post(body, timestamp=int(time.time()) - 5 * 60 - 5).status_code == 401
    assert client.post(body, signature="v0=" + "0" * 64).status_code == 401
    assert stack.workspace("ml-a--retried") is None  # nothing happened

    first = client.post(body)
    again = client.post(body, retry=1)  # Slack's retry: same body, new signature
    assert first.status_code == again.status_code == 200
    assert first.json()["text"] == again.json()["text"]
    requestid = first.json()["metadata"]["event_payload"]["requestid"]
    notes = stack.wait_for(lambda: client.messages(requestid=requestid), timeout=120,
                           what="the RUNNING notification")
    assert "retried is RUNNING" in notes[0]["text"]
    ledger = [d.to_dict() for d in stack.db.collection("processed").stream()]
    effects = [d for d in ledger if d.get("requestid") == requestid
               and d.get("consumer") == "on_workspace_requested"]
    assert len(effects) == 1  # the second delivery was a duplicate for the ledger
    assert stack.workspace("ml-a--retried")["version"] == 2  # PROVISIONING, RUNNING: once
    time.sleep(1)
    assert len(client.messages(requestid=requestid)) == 1  # and one notification

    carol = client.send("status retried --team ml-a", user="U0CAROL")
    assert carol.status == 200 and "You are not a member of team ml-a" in carol.text
    carol = client.send("delete retried", user="U0CAROL")
    assert "Nothing done: there is no workspace retried in team ml-b" in carol.text
    stranger = client.send("list", user="U0NOBODY")
    assert "I don't know you yet" in stranger.text and "carol (team ml-b)" in stranger.text
    assert "Deleting retried" in client.send("delete retried", user="U0BOB").text
    dead = json.loads(stack.cli("dlq", "--json").stdout)
    assert [d for d in dead if d["consumer"] == "notify_chat"] == []
