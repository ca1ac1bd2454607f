"""The embedded local deployment of Stasis: everything `stasis up` runs on one machine, on
loopback only.

- ``settings``: every port, path and name of the local stack, in one place;
- ``processes``: its child services (the Firestore and Pub/Sub emulators of the Google
  Cloud CLI, fake-gcs-server, the function host, the node agent, the Slack sink, the
  scheduler), each in its own process group, recorded in pid files, stopped as a group
  (the mechanics are ``runtime.supervisor``'s);
- ``local``: up, down and status of the whole stack; ``host``: the function host (every
  function in one gunicorn process, two workers); ``topology``: topics, push subscriptions and
  dead-letter topics; ``scheduler``: the local Cloud Scheduler; ``persistence``: the
  control plane's state across `stasis down`/`up`; ``admin``: the admin file applied (and
  the example catalog seeded); ``chat`` and ``slack_sink``: Slack's side of chat;
  ``portal``: the portal's session secret and the sign-in request of `stasis portal`;
  ``sandboxes``: what `stasis down` does about running sandboxes;

The `stasis` command that drives it is ``stasis_cli``. Nothing here is imported by
``functions``, ``runtime`` or ``events``.
"""
