"""The ``/ws`` grammar: text in, a Command, a Help or a ParseError out. Pure, never raises.

Each verb is described once, as data (:data:`VERBS`): its positional arguments, its flags,
a summary and examples. The parser, the per-command ``--help`` and the "did you mean"
suggestions are all derived from that table, so they cannot disagree.

Forms accepted for every verb: ``--flag value``, ``--flag=value``, ``-h`` / ``--help``
anywhere, and the positional shortcuts the table names (``/ws create mynb cpu-small`` is
``/ws create mynb --profile cpu-small``). Verbs and flags are case-insensitive; names are
not (they are validated and a fix is suggested). Chat clients "improve" what people type:
an em or en dash where ``--`` was typed, smart quotes, non-breaking spaces; these are read
as what was meant.

``/ws sandbox`` is the one verb with free text: everything after a standalone ``--`` is the
task command, kept as typed (quotes included; smart quotes and dashes read as what was
meant; Slack's ``&amp; &lt; &gt;`` escapes and ``<url|label>`` links undone), so that
``-- python -m pytest -k "not slow"`` reaches the sandbox intact.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from enum import StrEnum

from functions.domain import frontdoor
from functions.domain.catalog import parse_quantity
from functions.domain.frontdoor import suggest_name as suggest_name
from functions.domain.links import parse_ttl

COMMAND = "/ws"


class Verb(StrEnum):
    CREATE = "create"
    LIST = "list"
    STATUS = "status"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    SNAPSHOTS = "snapshots"
    CATALOG = "catalog"
    QUOTA = "quota"
    LINK = "link"
    REVOKE = "revoke"
    SANDBOX = "sandbox"
    HELP = "help"


#: Verbs that change a workspace: they publish an event and a notification follows.
ACTIONS = frozenset({Verb.CREATE, Verb.PAUSE, Verb.RESUME, Verb.DELETE})

ALIASES: dict[str, Verb] = {"ls": Verb.LIST, "rm": Verb.DELETE, "info": Verb.STATUS,
                            "?": Verb.HELP}


@dataclass(frozen=True)
class Flag:
    name: str
    help: str
    metavar: str = ""  # empty: a switch without a value

    @property
    def takes_value(self) -> bool:
        return bool(self.metavar)

    def usage(self) -> str:
        return f"--{self.name} {self.metavar}" if self.takes_value else f"--{self.name}"


@dataclass(frozen=True)
class Positional:
    field: str  # the Command field it fills
    metavar: str
    required: bool = True

    def usage(self) -> str:
        return self.metavar if self.required else f"[{self.metavar}]"


_TEAM = Flag("team", "act in this team (default: your first team)", "TEAM")
_PROFILE = Flag("profile", "hardware profile (see `/ws catalog`)", "PROFILE")
_NAME = Positional("name", "NAME")


@dataclass(frozen=True)
class VerbSpec:
    verb: Verb
    summary: str
    positionals: tuple[Positional, ...] = ()
    flags: tuple[Flag, ...] = ()
    examples: tuple[str, ...] = ()
    #: What follows the options (``-- COMMAND`` for sandbox).
    tail: str = ""

    def usage(self) -> str:
        parts = [COMMAND, str(self.verb), *(p.usage() for p in self.positionals)]
        parts += [f"[{f.usage()}]" + ("..." if f.name in _REPEATABLE else "")
                  for f in self.flags]
        return " ".join(parts + ([self.tail] if self.tail else []))

    def flag(self, name: str) -> Flag | None:
        return next((f for f in self.flags if f.name == name), None)


VERBS: dict[Verb, VerbSpec] = {spec.verb: spec for spec in (
    VerbSpec(Verb.CREATE, "create a workspace",
             (_NAME, Positional("profile", "PROFILE", required=False)),
             (_PROFILE, Flag("ide", "jupyterlab or vscode", "IDE"),
              Flag("env", "environment (see `/ws catalog`)", "ENV"), _TEAM),
             ("/ws create mynb --profile cpu-small",
              "/ws create mynb gpu-small --env python-3-11")),
    VerbSpec(Verb.LIST, "your team's workspaces and their state", (),
             (Flag("all", "include deleted workspaces"), _TEAM), ("/ws list",)),
    VerbSpec(Verb.STATUS, "state, URL, timings and snapshot of a workspace", (_NAME,),
             (_TEAM,), ("/ws status mynb",)),
    VerbSpec(Verb.PAUSE, "pause with the running state (kernels kept, hardware released)",
             (_NAME,), (_TEAM,), ("/ws pause mynb",)),
    VerbSpec(Verb.RESUME, "resume into the live kernels, optionally on another profile",
             (_NAME, Positional("profile", "PROFILE", required=False)),
             (_PROFILE, Flag("device-arrays-to-cpu", "restore GPU tensors and arrays onto CPU"),
              _TEAM),
             ("/ws resume mynb", "/ws resume mynb --profile cpu-large",
              "/ws resume mynb cpu-large --device-arrays-to-cpu")),
    VerbSpec(Verb.DELETE, "delete a workspace and its snapshots", (_NAME,),
             (Flag("keep-home", "keep the home directory (files, installed packages)"), _TEAM),
             ("/ws delete mynb", "/ws delete mynb --keep-home")),
    VerbSpec(Verb.SNAPSHOTS, "the snapshots of a workspace", (_NAME,), (_TEAM,),
             ("/ws snapshots mynb",)),
    VerbSpec(Verb.CATALOG, "what your team may use: profiles with costs, environments, IDEs",
             (), (_TEAM,), ("/ws catalog",)),
    VerbSpec(Verb.QUOTA, "your team's quotas and what it uses", (), (_TEAM,), ("/ws quota",)),
    VerbSpec(Verb.LINK, "a short-lived link for a coding agent to a workspace", (_NAME,),
             (_TEAM,), ("/ws link mynb",)),
    VerbSpec(Verb.REVOKE, "revoke an agent link", (Positional("link", "LINK_ID"),), (_TEAM,),
             ("/ws revoke lnk-3f2a",)),
    VerbSpec(Verb.SANDBOX, "run a task on a repository in an isolated sandbox and get a patch "
             "back for review; `/ws sandbox list`, `/ws sandbox show ID` follow them, "
             "`/ws sandbox resume ID` brings back a suspended one",
             (Positional("repository", "REPOSITORY"),),
             (Flag("ref", "base ref to start from (default HEAD)", "REF"),
              Flag("cpu-seconds", "CPU time limit (default: the team's policy)", "N"),
              Flag("memory", "memory limit, e.g. 2Gi (default: the team's policy)", "SIZE"),
              Flag("wall-clock", "wall clock limit, e.g. 30m (default: the team's policy)",
                   "DURATION"),
              Flag("processes", "processes at once (default: the team's policy)", "N"),
              Flag("disk", "disk quota of the working copy, home and tmp, e.g. 4Gi "
                           "(default: the team's policy)", "SIZE"),
              Flag("allow", "a network destination the task may reach (repeat for more; "
                            "none by default)", "HOST"),
              _TEAM),
             ("/ws sandbox https://github.com/acme/calc --ref main --wall-clock 30m "
              "-- python -m pytest -x",
              "/ws sandbox /srv/repos/calc --memory 4Gi --allow pypi.org -- make test",
              "/ws sandbox list",
              "/ws sandbox show sbx-20260504-120000-ab12cd",
              "/ws sandbox resume sbx-20260504-120000-ab12cd"),
             tail="-- COMMAND"),
    VerbSpec(Verb.HELP, "this help, or one command's", (Positional("topic", "COMMAND",
                                                                   required=False),),
             (), ("/ws help", "/ws help create")),
)}


class SandboxAction(StrEnum):
    RUN = "run"
    LIST = "list"
    SHOW = "show"
    RESUME = "resume"


@dataclass(frozen=True)
class SandboxArgs:
    """What ``/ws sandbox`` asked for. ``limits`` are sandbox.requested's (name, value)
    pairs: ``cpu_seconds``, ``memory`` (as typed, e.g. "2Gi"), ``wall_clock_seconds``,
    ``processes``."""

    action: SandboxAction
    repository: str | None = None
    ref: str | None = None
    limits: tuple[tuple[str, int | str], ...] = ()
    allow: tuple[str, ...] = ()
    task: str | None = None
    sandbox_id: str | None = None
    all: bool = False


@dataclass(frozen=True)
class Command:
    verb: Verb
    name: str | None = None
    team: str | None = None
    profile: str | None = None
    ide: str | None = None
    environment: str | None = None
    keep_home: bool = False
    all: bool = False
    link: str | None = None
    sandbox: SandboxArgs | None = None
    device_arrays_to_cpu: bool = False


@dataclass(frozen=True)
class Help:
    """Show the help of ``topic`` (None: the overview)."""

    topic: Verb | None = None


@dataclass(frozen=True)
class ParseError:
    """What was wrong and what to type instead; ``verb`` when the verb itself was fine."""

    message: str
    verb: Verb | None = None


Parsed = Command | Help | ParseError

# Values checked as slugs, and the Command field each flag fills.
_FIELD_OF_FLAG = {"team": "team", "profile": "profile", "ide": "ide", "env": "environment",
                  "keep-home": "keep_home", "all": "all",
                  "device-arrays-to-cpu": "device_arrays_to_cpu"}
_SLUG_FIELDS = {"name": "name", "team": "team", "profile": "profile", "ide": "IDE",
                "environment": "environment"}
_DASHES = str.maketrans({"\u2014": "--", "\u2013": "--", "\u2015": "--", "\u2212": "-",
                         "\u2012": "-", "\u2010": "-", "\u2011": "-"})
_QUOTES = str.maketrans("", "", "\"'\u201c\u201d\u2018\u2019`")


def parse(text: str) -> Parsed:
    """The command in the text after ``/ws``. Total: any string gives one of the three."""
    tokens = _tokens(text)
    if not tokens:
        return Help()
    head, rest = tokens[0], tokens[1:]
    if head.lower() in ("-h", "--help", "help") or ALIASES.get(head.lower()) == Verb.HELP:
        return _help_topic(rest)
    verb = _verb(head.lower())
    if verb is None:
        return ParseError(f"there is no command `{show(head)}`.{_did_you_mean_verb(head)} "
                          f"Commands: {', '.join(v for v in VERBS if v != Verb.HELP)}; "
                          f"`{COMMAND} help` explains them.")
    if verb == Verb.SANDBOX:
        return _parse_sandbox(text)
    return _parse_verb(VERBS[verb], rest)


def _help_topic(rest: list[str]) -> Parsed:
    if not rest:
        return Help()
    verb = _verb(rest[0].lower().lstrip("-"))
    if verb is None:
        return ParseError(f"there is no command `{show(rest[0])}` to explain."
                          f"{_did_you_mean_verb(rest[0])}", Verb.HELP)
    return Help(verb)


def _parse_verb(spec: VerbSpec, tokens: list[str]) -> Parsed:
    values: dict[str, str | bool] = {}
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.lower() in ("-h", "--help"):
            return Help(spec.verb)
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        name, eq, inline = token.lstrip("-").partition("=")
        flag = spec.flag(name.lower())
        if flag is None:
            return _error(spec, f"`{show(token)}` is not an option of `{spec.verb}`."
                                f"{_did_you_mean_flag(spec, name)}")
        field = _FIELD_OF_FLAG[flag.name]
        if field in values:
            return _error(spec, f"`--{flag.name}` is given twice.")
        if not flag.takes_value:
            if eq:
                return _error(spec, f"`--{flag.name}` takes no value.")
            values[field] = True
            continue
        if eq:
            value = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value = tokens[i]
            i += 1
        else:
            return _error(spec, f"`--{flag.name}` needs a value: `--{flag.name} "
                                f"{flag.metavar}`.")
        values[field] = value
    for position, given in zip(spec.positionals, positionals, strict=False):
        if position.field in values:
            return _error(spec, f"{position.metavar} is given twice (`{show(given)}` and "
                                f"`--{position.field}`).")
        values[position.field] = given
    if len(positionals) > len(spec.positionals):
        extra = positionals[len(spec.positionals)]
        return _error(spec, f"unexpected `{show(extra)}`.")
    missing = [p for p in spec.positionals if p.required and p.field not in values]
    if missing:
        return _error(spec, f"{missing[0].metavar} is missing.")
    for field, what in _SLUG_FIELDS.items():
        slug = values.get(field)
        if isinstance(slug, str):
            problem = check_name(slug, what)
            if problem:
                return _error(spec, problem)
    link = values.get("link")
    if isinstance(link, str) and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", link):
        return _error(spec, f"`{show(link)}` is not a link id (see the id `{COMMAND} link` "
                            "printed).")
    def text(field: str) -> str | None:
        value = values.get(field)
        return value if isinstance(value, str) else None

    return Command(spec.verb, name=text("name"), team=text("team"), profile=text("profile"),
                   ide=text("ide"), environment=text("environment"),
                   keep_home=values.get("keep_home") is True, all=values.get("all") is True,
                   link=text("link"),
                   device_arrays_to_cpu=values.get("device_arrays_to_cpu") is True)


# --- /ws sandbox ------------------------------------------------------------------------------
_REPEATABLE = frozenset({"allow"})
_SEPARATOR = re.compile(r"(?:^|\s)--(?=\s|$)")
_SLACK_LINK = re.compile(r"<((?:https?|ssh|git)://[^|>\s]+|mailto:[^|>\s]+)(?:\|[^>]*)?>")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'",
                               "\u00a0": " "})
SANDBOX_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/@{}^~-]{0,199}")
_HOST = re.compile(r"[A-Za-z0-9*][A-Za-z0-9.:/*-]{0,252}")
_LIMIT_FLAGS = {"cpu-seconds": "cpu_seconds", "memory": "memory", "disk": "disk",
                "wall-clock": "wall_clock_seconds", "processes": "processes"}
TASK_MAX = 10_000


def _parse_sandbox(text: str) -> Parsed:
    """``sandbox REPOSITORY [options] -- COMMAND``, ``sandbox list``, ``sandbox show ID``,
    ``sandbox resume ID``."""
    spec = VERBS[Verb.SANDBOX]
    normal = unicodedata.normalize("NFC", text).translate(_DASHES)
    separator = _SEPARATOR.search(normal)
    head = normal[:separator.start()] if separator else normal
    task = _slack_text(normal[separator.end():]).strip() if separator else None
    tokens = head.translate(_QUOTES).split()[1:]  # after the verb
    if any(t.lower() in ("-h", "--help") for t in tokens):
        return Help(Verb.SANDBOX)
    action = tokens[0].lower() if tokens else ""
    if action in (SandboxAction.LIST, SandboxAction.SHOW, SandboxAction.RESUME):
        return _sandbox_listing(spec, SandboxAction(action), tokens[1:], task)
    values, allow, positionals = _sandbox_options(spec, tokens, has_task=task is not None)
    if isinstance(values, ParseError):
        return values
    if not positionals:
        return _error(spec, "REPOSITORY is missing: a git URL or a path on the runtime's host.")
    if len(positionals) > 1:
        return _error(spec, f"unexpected `{show(positionals[1])}`: the task command goes after "
                            "a standalone `--`.")
    repository = _slack_text(positionals[0])
    if not ("://" in repository or repository.startswith(("git@", "/", "~"))):
        return _error(spec, f"`{show(repository)}` is not a repository: give a git URL "
                            "(https://..., git@host:org/repo.git) or an absolute path on the "
                            "runtime's host.")
    if not task:
        return _error(spec, "the task command is missing: put it after a standalone `--`, e.g. "
                            "`-- python -m pytest -x`.")
    if len(task) > TASK_MAX:
        return _error(spec, f"the task command is over {TASK_MAX} characters.")
    ref = values.get("ref")
    if ref is not None and not _REF.fullmatch(ref):
        return _error(spec, f"`{show(ref)}` is not a git ref (a branch, tag or commit, e.g. "
                            "`main`, `v1.2`, `HEAD~1`).")
    limits: list[tuple[str, int | str]] = []
    for flag, field in _LIMIT_FLAGS.items():
        value = values.get(flag)
        if value is None:
            continue
        limit = _limit(flag, value)
        if isinstance(limit, ParseError):
            return _error(spec, limit.message)
        limits.append((field, limit))
    for host in allow:
        if not _HOST.fullmatch(host):
            return _error(spec, f"`{show(host)}` is not a network destination (a host name, "
                                "`*.domain` or a CIDR).")
    team = values.get("team")
    problem = check_name(team, "team") if team is not None else None
    if problem:
        return _error(spec, problem)
    return Command(Verb.SANDBOX, team=team, sandbox=SandboxArgs(
        SandboxAction.RUN, repository=repository, ref=ref, limits=tuple(limits),
        allow=tuple(dict.fromkeys(allow)), task=task))


def _sandbox_options(spec: VerbSpec, tokens: list[str], *, has_task: bool
                     ) -> tuple[dict[str, str] | ParseError, list[str], list[str]]:
    values: dict[str, str] = {}
    allow: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        name, eq, inline = token.lstrip("-").partition("=")
        flag = spec.flag(name.lower())
        if flag is None:
            hint = "" if has_task else (" If it is part of the task command, put the command "
                                        "after a standalone `--`.")
            return (_error(spec, f"`{show(token)}` is not an option of `sandbox`."
                                 f"{_did_you_mean_flag(spec, name)}{hint}"), allow, positionals)
        if eq:
            value = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value = tokens[i]
            i += 1
        else:
            return (_error(spec, f"`--{flag.name}` needs a value: `--{flag.name} "
                                 f"{flag.metavar}`."), allow, positionals)
        if flag.name in _REPEATABLE:
            allow.append(value)
        elif flag.name in values:
            return _error(spec, f"`--{flag.name}` is given twice."), allow, positionals
        else:
            values[flag.name] = value
    return values, allow, positionals


def _sandbox_listing(spec: VerbSpec, action: SandboxAction, tokens: list[str],
                     task: str | None) -> Parsed:
    usage = (f"`{COMMAND} sandbox list [--all] [--team TEAM]`" if action == SandboxAction.LIST
             else f"`{COMMAND} sandbox {action} ID [--team TEAM]`")

    def error(message: str) -> ParseError:
        return ParseError(f"{message}\nUsage: {usage}.", Verb.SANDBOX)

    if task is not None:
        return error(f"`sandbox {action}` takes no task command.")
    team: str | None = None
    everything = False
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        name, eq, inline = token.lstrip("-").partition("=")
        if not token.startswith("--"):
            rest.append(token)
        elif name.lower() == "team":
            if eq:
                team = inline
            elif i < len(tokens):
                team, i = tokens[i], i + 1
            else:
                return error("`--team` needs a value: `--team TEAM`.")
        elif name.lower() == "all" and action == SandboxAction.LIST and not eq:
            everything = True
        else:
            return error(f"`{show(token)}` is not an option of `sandbox {action}`.")
    if team is not None and (problem := check_name(team, "team")):
        return error(problem)
    if action == SandboxAction.LIST:
        if rest:
            return error(f"unexpected `{show(rest[0])}`.")
        return Command(Verb.SANDBOX, team=team,
                       sandbox=SandboxArgs(SandboxAction.LIST, all=everything))
    if len(rest) != 1:
        return error("give one sandbox id (`/ws sandbox list` shows them)." if not rest
                     else f"unexpected `{show(rest[1])}`.")
    if not SANDBOX_ID_PATTERN.fullmatch(rest[0]):
        return error(f"`{show(rest[0])}` is not a sandbox id (like `sbx-20260504-120000-ab12cd`;"
                     " `/ws sandbox list` shows them).")
    return Command(Verb.SANDBOX, team=team, sandbox=SandboxArgs(action, sandbox_id=rest[0]))


def _limit(flag: str, value: str) -> int | str | ParseError:
    """The value of a limit flag as sandbox.requested takes it, or why it is not one."""
    try:
        if flag in ("memory", "disk"):
            if parse_quantity(value) < 1:
                raise ValueError("at least one byte")
            return value
        if flag == "wall-clock":
            number = parse_ttl(value)
        elif value.isdigit():
            number = int(value)
        else:
            raise ValueError("a whole number")
    except ValueError:
        shown = {"memory": "a size like 2Gi or 512Mi", "disk": "a size like 4Gi",
                 "wall-clock": "a duration like 30m, "
                 "1h or 90s"}.get(flag, "a whole number")
        return ParseError(f"`--{flag} {show(value)}`: {flag} takes {shown}.")
    if number < 1:
        return ParseError(f"`--{flag} {show(value)}`: {flag} must be at least 1.")
    return number


def _slack_text(text: str) -> str:
    """Free text as the user typed it: Slack's links and HTML escapes undone, smart quotes
    and non-breaking spaces read as plain ones."""
    text = _SLACK_LINK.sub(lambda m: m.group(1), text).translate(_SMART_QUOTES)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def check_name(value: str, what: str = "name") -> str | None:
    """None if ``value`` is a valid slug, else why not and a fix: ``frontdoor.check_name``,
    the words of every front door, with the user's text escaped for Slack."""
    return frontdoor.check_name(value, what, shown=show)


def show(token: str) -> str:
    """A user's token, safe to echo inside a code span (``frontdoor.plain``), with Slack's
    markup characters escaped."""
    clean = frontdoor.plain(token)
    return clean.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def usage(verb: Verb) -> str:
    return VERBS[verb].usage()


def help_text(topic: Verb | None = None) -> str:
    """The overview, or one command's usage, options and examples."""
    if topic is None:
        lines = [f"`{COMMAND} <command>`: your ML workspaces, paused with their live kernels "
                 "and resumed into them.", ""]
        lines += [f"• `{v}`  {spec.summary}" for v, spec in VERBS.items()]
        lines += ["", f"`{COMMAND} <command> --help` for its options, e.g. "
                      f"`{COMMAND} create --help`."]
        return "\n".join(lines)
    spec = VERBS[topic]
    lines = [f"`{spec.usage()}`", spec.summary]
    if spec.flags:
        lines += [""] + [f"• `{f.usage()}`  {f.help}" for f in spec.flags]
    if spec.examples:
        lines += ["", "Examples:"] + [f"`{e}`" for e in spec.examples]
    return "\n".join(lines)


def _tokens(text: str) -> list[str]:
    text = unicodedata.normalize("NFC", text).translate(_DASHES).translate(_QUOTES)
    return text.split()


def _verb(word: str) -> Verb | None:
    if word in ALIASES:
        return ALIASES[word]
    try:
        return Verb(word)
    except ValueError:
        return None


def _did_you_mean_verb(word: str) -> str:
    word = word.lower()
    candidates = [str(v) for v in VERBS]
    close = difflib.get_close_matches(word, candidates, n=2, cutoff=0.6)
    if not close and len(word) >= 2:
        close = [c for c in candidates if c.startswith(word)][:2]
    return _did_you_mean(close)


def _did_you_mean_flag(spec: VerbSpec, name: str) -> str:
    names = [f.name for f in spec.flags]
    close = difflib.get_close_matches(name.lower(), names, n=2, cutoff=0.6)
    shown = [f"--{c}" for c in close]
    if shown:
        return _did_you_mean(shown)
    options = ", ".join(f"`{f.usage()}`" for f in spec.flags)
    return f" Options: {options}." if options else f" `{spec.verb}` takes no options."


def _did_you_mean(close: list[str]) -> str:
    if not close:
        return ""
    return " Did you mean " + " or ".join(f"`{c}`" for c in close) + "?"


def _error(spec: VerbSpec, message: str) -> ParseError:
    return ParseError(f"{message}\nUsage: `{spec.usage()}` (`{COMMAND} {spec.verb} --help` "
                      "for more).", spec.verb)
