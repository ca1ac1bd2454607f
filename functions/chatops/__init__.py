"""The chat front door: the Slack ``/ws`` command and the notifications that follow it.

Layers, from pure to I/O (``tests/unit/test_chat_replies.py`` keeps the pure ones pure):

- ``grammar``  PURE. ``/ws`` text -> a Command, a Help, or a ParseError that says what to
  type instead (usage, "did you mean", name rules). Never raises.
- ``replies``  PURE. Everything the bot says: acks, listings, notifications ("mynb paused —
  1.2 GiB in 3.4 s"), sizes and durations for people, and the reply target a request
  carries (``WorkspaceRequested.reply_to``).
- ``signing``  PURE. Slack's v0 request signature and the deterministic request id of a
  slash command (so a Slack retry has one effect).
- ``ports``    what the two handlers below need from the world (protocols only).
- ``service``  the slash command: identity (Slack user -> Stasis user via the catalog), the
  team's workspaces only, a cheap preview of the lifecycle decision, then one event. Answers
  within Slack's 3 seconds; the work happens in the functions that consume the event.
- ``notify``   the ``workspace.state_changed`` consumer that tells the requester how it went:
  through the request's ``response_url`` while Slack still accepts it, else
  ``chat.postMessage`` to the requester; and the ``sandbox.state_changed`` consumers that
  do the same for ``/ws sandbox`` (how it ended, the patch to review; a suspension, how to
  resume it).

Slack itself (bolt, slack_sdk) appears only in ``functions/adapters/slack.py``.
"""
