"""The admin config: schema, cross-reference checks, and the catalog's resolution rules.

Golden files live in tests/data/config/: ``good-*.yaml`` must pass both layers, every
``bad-*.yaml`` is listed in BAD_FILES with the exact paths each layer reports.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from functions.domain.catalog import (
    Catalog,
    ConfigError,
    Environment,
    NoticeKind,
    Profile,
    Refusal,
    RefusalReason,
    Resolved,
    accelerator_matches,
    check_hardware,
    config_documents,
    config_revision,
    format_quantity,
    human_bytes,
    parse_cpu_millis,
    parse_quantity,
    pointer,
    topology_chips,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
CONFIG_DIR = ROOT / "tests" / "data" / "config"
EXAMPLE = ROOT / "examples" / "stasis.yaml"
CONFIG_SCHEMA = json.loads((SCHEMAS / "config.schema.json").read_text())
VALIDATOR = Draft202012Validator(CONFIG_SCHEMA)
DOCUMENT_KINDS = ("ide", "environment", "profile", "team")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def schema_paths(config: Any) -> list[str]:
    return sorted(pointer(*e.absolute_path) for e in VALIDATOR.iter_errors(config))


def domain_paths(config: Any) -> list[str]:
    return sorted(p.path for p in validate_config(config))


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    config: dict[str, Any] = load(EXAMPLE)
    return config


@pytest.fixture(scope="module")
def catalog(example: dict[str, Any]) -> Catalog:
    return Catalog.from_config(example)


# --------------------------------------------------------------------------------------------
# Schemas and golden files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.schema.json",
                                  *(f"documents/{k}.json" for k in DOCUMENT_KINDS)])
def test_schemas_are_valid_draft_2020_12(name: str) -> None:
    Draft202012Validator.check_schema(json.loads((SCHEMAS / name).read_text()))


def _objects(node: Any, at: str = "#") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            found.append((at, node))
        for key, value in node.items():
            found.extend(_objects(value, f"{at}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_objects(value, f"{at}/{i}"))
    return found


def test_every_object_in_the_config_schema_is_closed_and_described() -> None:
    for at, node in _objects(CONFIG_SCHEMA):
        assert node.get("additionalProperties") is False, at
        assert node.get("description"), at


def test_example_passes_the_schema_and_the_domain_rules(example: dict[str, Any]) -> None:
    assert schema_paths(example) == []
    assert validate_config(example) == []


def test_example_offers_what_the_design_describes(catalog: Catalog) -> None:
    assert list(catalog.ides) == ["jupyterlab", "vscode"]
    assert list(catalog.environments) == ["python-3-11", "python-3-10", "python-3-9",
                                          "legacy-tf1"]
    assert list(catalog.profiles) == ["cpu-small", "cpu-large", "gpu-small", "tpu-v5e-8"]
    assert [e.id for e in catalog.listed_environments()] == ["python-3-11", "python-3-10"]
    gpu, tpu = catalog.profiles["gpu-small"], catalog.profiles["tpu-v5e-8"]
    assert (gpu.cpu_millis, gpu.memory_bytes, str(gpu.accelerator)) == (4000, 16 * 2**30,
                                                                        "1 x nvidia-l4")
    assert gpu.tolerations[0].to_k8s() == {"key": "nvidia.com/gpu", "operator": "Exists",
                                           "effect": "NoSchedule"}
    assert tpu.accelerator is not None and tpu.accelerator.topology == "2x4"
    assert catalog.teams["ml-a"].quotas.snapshot_bytes == 50 * 2**30
    assert [t.id for t in catalog.teams_of("dev")] == ["ml-a"]
    assert catalog.user_for_slack("U0CAROL") == "carol"
    assert catalog.user_for_slack("U0NOBODY") is None


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("good-*.yaml")), ids=lambda p: p.name)
def test_good_files_pass_both_layers(path: Path) -> None:
    config = load(path)
    assert schema_paths(config) == []
    assert validate_config(config) == []
    Catalog.from_config(config)


#: file -> (paths the schema reports, paths validate_config reports)
BAD_FILES: dict[str, tuple[list[str], list[str]]] = {
    "bad-unknown-profile.yaml": ([], ["/teams/0/profiles/1"]),
    "bad-negative-quota.yaml": (["/teams/0/quotas/gpus"], ["/teams/0/quotas/gpus"]),
    "bad-unapproved-environment.yaml": ([], ["/profiles/0/environments/1"]),
    "bad-duplicate-id.yaml": ([], ["/profiles/1/id"]),
    "bad-redirect-cycle.yaml": ([], ["/environments/1/redirect", "/environments/2/redirect"]),
    "bad-deprecated-without-message.yaml": ([], ["/environments/1/message"]),
    "bad-redirect-chain.yaml": ([], ["/environments/2/redirect", "/environments/3/redirect",
                                     "/environments/5/redirect", "/environments/6/status"]),
    "bad-quantities.yaml": (
        ["/profiles/0/disk/size", "/profiles/0/memory", "/teams/0/quotas/snapshot_bytes"],
        ["/profiles/0/disk/size", "/profiles/0/memory", "/teams/0/quotas/snapshot_bytes"]),
    "bad-accelerators.yaml": (
        ["/profiles/0/accelerator", "/profiles/2/tolerations/0"],
        ["/profiles/0/accelerator/topology",
         "/profiles/0/node_selector/cloud.google.com~1gke-accelerator",
         "/profiles/1/accelerator/topology",
         "/profiles/1/node_selector/cloud.google.com~1gke-tpu-topology",
         "/profiles/1/reservation",
         "/profiles/2/accelerator/topology",
         "/profiles/2/node_selector/cloud.google.com~1gke-accelerator",
         "/profiles/2/node_selector/cloud.google.com~1gke-spot",
         "/profiles/2/tolerations/0/value"]),
    "bad-members.yaml": ([], ["/teams/0/members/1/user", "/teams/1/members/1/slack_user_id",
                              "/teams/2/members/0/slack_user_id"]),
    "bad-many-problems.yaml": (
        ["/teams/0/quotas/gpus"],
        ["/environments/1/message", "/environments/2/id",
         "/profiles/0/ides/1", "/profiles/0/node_selector/cloud.google.com~1gke-accelerator",
         "/profiles/0/reservation", "/teams/0/profiles/1", "/teams/0/quotas/gpus",
         "/teams/1/members/0/slack_user_id"]),
}


def test_every_bad_file_has_expectations() -> None:
    assert sorted(p.name for p in CONFIG_DIR.glob("bad-*.yaml")) == sorted(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_are_rejected_at_the_exact_paths(name: str) -> None:
    config = load(CONFIG_DIR / name)
    expected_schema, expected_domain = BAD_FILES[name]
    assert schema_paths(config) == sorted(expected_schema)
    assert domain_paths(config) == sorted(expected_domain)
    with pytest.raises(ConfigError) as raised:
        Catalog.from_config(config)
    assert sorted(p.path for p in raised.value.problems) == sorted(expected_domain)


@pytest.mark.parametrize(("name", "path", "message"), [
    ("bad-unknown-profile.yaml", "/teams/0/profiles/1",
     "unknown profile gpu-large (known profiles: cpu-small)"),
    ("bad-negative-quota.yaml", "/teams/0/quotas/gpus", "must be >= 0, got -1"),
    ("bad-unapproved-environment.yaml", "/profiles/0/environments/1",
     "environment python-3-13 is unapproved: approve it or remove it from this profile"),
    ("bad-duplicate-id.yaml", "/profiles/1/id",
     "duplicate id cpu-small: already used by /profiles/0"),
    ("bad-redirect-cycle.yaml", "/environments/1/redirect",
     "redirect cycle python-3-9 -> python-3-10 -> python-3-9: point each of them at a final "
     "environment"),
    ("bad-deprecated-without-message.yaml", "/environments/1/message",
     "deprecated environment python-3-10 needs a message that tells users what to use "
     "instead"),
    ("bad-redirect-chain.yaml", "/environments/2/redirect",
     "python-3-8 redirects to python-3-9, which itself redirects to python-3-11; point "
     "python-3-8 at python-3-11 directly"),
    ("bad-quantities.yaml", "/profiles/0/memory",
     "'4GB' is not a quantity: write a number with an optional suffix Ki, Mi, Gi, Ti, k, M, "
     'G or T, e.g. "4Gi"'),
    ("bad-accelerators.yaml", "/profiles/1/accelerator/topology",
     "topology 2x4 has 8 chips, which is not a multiple of count 3"),
    ("bad-members.yaml", "/teams/1/members/1/slack_user_id",
     "Slack user U0ALICE already acts as alice (at /teams/0/members/0/slack_user_id); one "
     "Slack user is one Stasis user"),
])
def test_problem_messages_say_what_to_do(name: str, path: str, message: str) -> None:
    problems = {p.path: p.message for p in validate_config(load(CONFIG_DIR / name))}
    assert problems[path] == message


def test_a_config_that_is_not_a_mapping_is_one_problem() -> None:
    assert [p.path for p in validate_config([])] == [""]  # type: ignore[arg-type]
    assert domain_paths({}) == ["/environments", "/ides", "/profiles", "/teams"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True)
    | st.sampled_from(["", "x", "2Gi", "500m", "deprecated", "tpu-x", "python-3-11", "ml-a",
                       "spot", "cloud.google.com/gke-accelerator"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*at, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_paths(value, (*at, i)))
    return found


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_validate_config_never_raises_on_a_damaged_config(data: st.DataObject) -> None:
    config = copy.deepcopy(load(EXAMPLE))
    for _ in range(data.draw(st.integers(1, 4))):
        paths = [p for p in _paths(config) if p]
        path = data.draw(st.sampled_from(paths))
        parent = config
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = data.draw(_json)
    problems = validate_config(config)
    assert all(p.path.startswith("/") and p.message for p in problems)


@given(_json)
def test_validate_config_never_raises_on_any_json(value: Any) -> None:
    validate_config(value)


# --------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------


def _document_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / "documents" / f"{kind}.json").read_text())
    return schema


@pytest.mark.parametrize("kind", DOCUMENT_KINDS)
def test_document_schemas_copy_the_config_definitions_exactly(kind: str) -> None:
    """Document schemas are self-contained copies; this keeps them from drifting."""
    doc, entry = _document_schema(kind), CONFIG_SCHEMA["$defs"][kind]
    for name, definition in doc["$defs"].items():
        assert definition == CONFIG_SCHEMA["$defs"][name], name
    for key, definition in entry["properties"].items():
        assert doc["properties"][key] == definition, key
    assert set(entry["required"]) <= set(doc["required"])
    assert doc["additionalProperties"] is False


def test_config_documents_match_the_document_schemas(example: dict[str, Any]) -> None:
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    docs = config_documents(example, applied_at=at, applied_by="dev")
    validators = {k: Draft202012Validator(_document_schema(k)) for k in DOCUMENT_KINDS}
    for kind, group in (("ide", docs.ides), ("environment", docs.environments),
                        ("profile", docs.profiles)):
        for doc in group.values():
            assert list(validators[kind].iter_errors(doc)) == []
    for team in docs.teams.values():
        # apply never writes usage; the store creates it as zeros with the team
        assert "usage" not in team
        created = {**team, "usage": {"workspaces": 0, "gpus": 0, "tpus": 0,
                                     "snapshot_bytes": 0}}
        assert list(validators["team"].iter_errors(created)) == []
    ml_a = docs.teams["ml-a"]
    assert ml_a["member_ids"] == ["alice", "bob", "dev"]
    assert ml_a["slack_user_ids"] == ["U0ALICE", "U0BOB"]
    assert ml_a["applied_at_ms"] == int(at.timestamp() * 1000)
    assert docs.revision == config_revision(example) == ml_a["revision"]
    assert docs.pricing["disk_gb_month"] == 0.17
    # the documents read back build the same catalog
    again = Catalog.from_config({"ides": list(docs.ides.values()),
                                 "environments": list(docs.environments.values()),
                                 "profiles": list(docs.profiles.values()),
                                 "teams": list(docs.teams.values()),
                                 "pricing": docs.pricing, "scheduling": docs.scheduling})
    assert again == Catalog.from_config(example)


def test_config_documents_refuse_a_bad_config_or_a_naive_time(example: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        config_documents(load(CONFIG_DIR / "bad-many-problems.yaml"),
                         applied_at=datetime.now(UTC), applied_by="dev")
    with pytest.raises(ValueError, match="timezone"):
        config_documents(example, applied_at=datetime(2025, 1, 1), applied_by="dev")


def test_revision_ignores_key_order() -> None:
    assert config_revision({"a": 1, "b": [1, 2]}) == config_revision({"b": [1, 2], "a": 1})
    assert config_revision({"a": 1}) != config_revision({"a": 2})


# --------------------------------------------------------------------------------------------
# Quantities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("4Gi", 4 * 2**30), ("512Mi", 512 * 2**20), ("1Ki", 1024), ("2Ti", 2 * 2**40),
    ("1k", 1000), ("3M", 3_000_000), ("85G", 85 * 10**9), ("1T", 10**12),
    ("1024", 1024), ("0", 0), ("1.5Gi", 3 * 2**29), ("0.5k", 500), ("1.1", 2),
])
def test_parse_quantity(text: str, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["4GB", "4gi", "", "-1Gi", "1e3", "Gi", " 4Gi", "500m",
                                  "1.Gi", "4 Gi", 4])
def test_parse_quantity_rejects(text: Any) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(("value", "millis"), [
    (1, 1000), (2, 2000), (0.5, 500), (0.1, 100), ("500m", 500), ("1.5", 1500), ("2", 2000),
    (0.0005, 1),
])
def test_parse_cpu_millis(value: Any, millis: int) -> None:
    assert parse_cpu_millis(value) == millis


@pytest.mark.parametrize("value", [0, -1, "0m", "0.5m", "1 cpu", True, None, float("inf"),
                                   0.0])
def test_parse_cpu_millis_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_cpu_millis(value)


@given(st.integers(min_value=0, max_value=2**50))
def test_format_quantity_round_trips(n: int) -> None:
    assert parse_quantity(format_quantity(n)) == n


@pytest.mark.parametrize(("n", "text"), [(50 * 2**30, "50Gi"), (3 * 2**29, "1.5Gi"),
                                         (512, "512"), (2**40, "1Ti")])
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_topology_chips() -> None:
    assert (topology_chips("2x4"), topology_chips("2x2x4")) == (8, 16)
    with pytest.raises(ValueError):
        topology_chips("8")


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------

AVAILABLE = "Available: python-3-11, python-3-10."


@pytest.mark.parametrize(("asked", "gets", "notices"), [
    ("python-3-11", "python-3-11", []),
    ("python-3-10", "python-3-10",
     [(NoticeKind.DEPRECATED, "python-3-10 is deprecated: Python 3.10 leaves support on "
                              "2025-06-30; move to python-3-11.")]),
    ("python-3-9", "python-3-11",
     [(NoticeKind.REDIRECTED, "python-3-9 was replaced by python-3-11: Python 3.9 is "
                              "end-of-life.")]),
])
def test_environment_resolution_goes_ahead(catalog: Catalog, asked: str, gets: str,
                                           notices: list[tuple[NoticeKind, str]]) -> None:
    result = catalog.resolve_environment(asked)
    assert isinstance(result, Resolved) and result.ok
    assert result.value.id == gets
    assert [(n.kind, n.message) for n in result.notices] == notices


@pytest.mark.parametrize(("asked", "reason", "message"), [
    ("legacy-tf1", RefusalReason.ENVIRONMENT_HIDDEN,
     "environment legacy-tf1 is no longer offered: TensorFlow 1 is retired; existing "
     "workspaces keep it, new ones use python-3-11. Use one of: python-3-11, python-3-10."),
    ("python-3-12", RefusalReason.UNKNOWN_ENVIRONMENT,
     f"there is no environment python-3-12. Did you mean python-3-11 or python-3-10? "
     f"{AVAILABLE}"),
    ("pytorch", RefusalReason.UNKNOWN_ENVIRONMENT, f"there is no environment pytorch. {AVAILABLE}"),
])
def test_environment_resolution_refuses(catalog: Catalog, asked: str, reason: RefusalReason,
                                        message: str) -> None:
    assert catalog.resolve_environment(asked) == Refusal(reason, message)


def test_unapproved_environment_is_refused(example: dict[str, Any]) -> None:
    config = copy.deepcopy(example)
    config["environments"].append({"id": "python-3-13", "title": "3.13", "image": "python:3.13",
                                   "status": "unapproved"})
    result = Catalog.from_config(config).resolve_environment("python-3-13")
    assert result == Refusal(RefusalReason.ENVIRONMENT_UNAPPROVED,
                             "environment python-3-13 is not approved yet; ask an admin to "
                             "approve it, or use one of: python-3-11, python-3-10.")


def test_a_redirect_to_a_deprecated_environment_carries_both_notices() -> None:
    catalog = Catalog.from_config(load(CONFIG_DIR / "good-every-field.yaml"))
    result = catalog.resolve_environment("python-3-9")
    assert isinstance(result, Resolved) and result.value.id == "python-3-10"
    assert [n.kind for n in result.notices] == [NoticeKind.REDIRECTED, NoticeKind.DEPRECATED]


@pytest.mark.parametrize(("team", "profile", "expected"), [
    ("ml-a", "tpu-v5e-8", "tpu-v5e-8"),
    ("ml-b", "tpu-v5e-8", Refusal(
        RefusalReason.PROFILE_NOT_ALLOWED,
        "profile tpu-v5e-8 is not available to team ml-b; ask carol to add it, or use one "
        "of: cpu-small, cpu-large, gpu-small.")),
    ("ml-b", "gpu-smal", Refusal(
        RefusalReason.UNKNOWN_PROFILE,
        "there is no profile gpu-smal. Did you mean gpu-small or cpu-small? Profiles for team "
        "ml-b: cpu-small, cpu-large, gpu-small.")),
    ("ml-c", "cpu-small", Refusal(RefusalReason.UNKNOWN_TEAM,
                                  "there is no team ml-c. Did you mean ml-b or ml-a?")),
])
def test_profile_resolution(catalog: Catalog, team: str, profile: str,
                            expected: str | Refusal) -> None:
    result = catalog.resolve_profile(team, profile)
    if isinstance(expected, Refusal):
        assert result == expected
    else:
        assert isinstance(result, Resolved) and result.value.id == expected


def test_profile_refusal_names_the_admins_when_there_is_no_contact(
        example: dict[str, Any]) -> None:
    config = copy.deepcopy(example)
    del config["teams"][0]["contact"]
    result = Catalog.from_config(config).resolve_profile("ml-a", "nope-profile")
    assert isinstance(result, Refusal)
    config["teams"][0]["profiles"] = ["cpu-small"]
    result = Catalog.from_config(config).resolve_profile("ml-a", "gpu-small")
    assert isinstance(result, Refusal)
    assert "ask a team admin (alice, dev) to add it" in result.message


@pytest.mark.parametrize(("ide", "available", "expected"), [
    ("vscode", {"jupyterlab", "vscode"}, "vscode"),
    ("jupyterlab", {"jupyterlab"}, "jupyterlab"),
    ("vscode", {"jupyterlab"}, Refusal(
        RefusalReason.IDE_UNAVAILABLE,
        "vscode is not available on this runtime (code-server not installed); use jupyterlab")),
    ("jupyterlab", set(), Refusal(
        RefusalReason.IDE_UNAVAILABLE,
        "jupyterlab is not available on this runtime (not supported); no IDE is available "
        "here")),
    ("vs-code", {"jupyterlab", "vscode"}, Refusal(
        RefusalReason.UNKNOWN_IDE,
        "there is no IDE vs-code. Did you mean vscode? Available: jupyterlab, vscode.")),
])
def test_ide_resolution(catalog: Catalog, ide: str, available: set[str],
                        expected: str | Refusal) -> None:
    result = catalog.resolve_ide(ide, available)
    if isinstance(expected, Refusal):
        assert result == expected
    else:
        assert isinstance(result, Resolved) and result.value.id == expected


def test_available_ides_follow_the_installed_binaries(catalog: Catalog) -> None:
    assert catalog.available_ides(set()) == {"jupyterlab"}
    assert catalog.available_ides({"code-server"}) == {"jupyterlab", "vscode"}


NO_GPU_HOST = {"accelerators": {}, "cpus": 8, "memory_bytes": 32 * 2**30}


@pytest.mark.parametrize(("profile", "host", "expected"), [
    ("cpu-small", {"accelerators": {}, "cpus": 2, "memory_bytes": 4 * 2**30}, None),
    ("cpu-small", {}, None),
    ("gpu-small", {"cpus": 8}, None),  # a runtime that does not report accelerators
    ("gpu-small", {"accelerators": {"nvidia-l4": 1}, "cpus": 8, "memory_bytes": 32 * 2**30},
     None),
    ("gpu-small", NO_GPU_HOST, Refusal(
        RefusalReason.ACCELERATOR_UNAVAILABLE,
        "profile gpu-small needs 1 x nvidia-l4 but this host has no GPU: choose a profile "
        "without GPUs here, or use a cluster that has nvidia-l4")),
    ("gpu-small", {"accelerators": {"nvidia-tesla-t4": 2, "tpu-v5-lite-podslice": 8}}, Refusal(
        RefusalReason.ACCELERATOR_UNAVAILABLE,
        "profile gpu-small needs 1 x nvidia-l4 but this host has 2 x nvidia-tesla-t4: choose a "
        "profile without GPUs here, or use a cluster that has nvidia-l4")),
    ("tpu-v5e-8", {"accelerators": {"tpu-v5-lite-podslice": 4}}, Refusal(
        RefusalReason.ACCELERATOR_UNAVAILABLE,
        "profile tpu-v5e-8 needs 8 x tpu-v5-lite-podslice but this host has only 4 x "
        "tpu-v5-lite-podslice: choose a profile without TPUs here, or use a cluster that has "
        "tpu-v5-lite-podslice")),
    ("tpu-v5e-8", {"accelerators": {"nvidia-l4": 1}}, Refusal(
        RefusalReason.ACCELERATOR_UNAVAILABLE,
        "profile tpu-v5e-8 needs 8 x tpu-v5-lite-podslice but this host has no TPU: choose a "
        "profile without TPUs here, or use a cluster that has tpu-v5-lite-podslice")),
    # CPU and memory are capped by the local runtime, never refused
    ("cpu-large", {"accelerators": {}, "cpus": 1, "memory_bytes": 2**30}, None),
    # nvidia-smi names serve GKE names: "tesla" is ignored, one may extend the other
    ("gpu-t4", {"accelerators": {"nvidia-t4": 1}}, None),
    ("gpu-h200", {"accelerators": {"nvidia-h200": 2}}, None),
    ("gpu-h200", {"accelerators": {"nvidia-h200": 1, "nvidia-h200-141gb": 1}}, None),
    ("gpu-h200", {"accelerators": {"nvidia-h20": 2}}, Refusal(
        RefusalReason.ACCELERATOR_UNAVAILABLE,
        "profile gpu-h200 needs 2 x nvidia-h200-141gb but this host has 2 x nvidia-h20: choose "
        "a profile without GPUs here, or use a cluster that has nvidia-h200-141gb")),
])
def test_check_hardware(catalog: Catalog, profile: str, host: dict[str, Any],
                        expected: Refusal | None) -> None:
    profiles = {**catalog.profiles, **_gpu_profiles()}
    assert check_hardware(profiles[profile], host) == expected


def _gpu_profiles() -> dict[str, Profile]:
    base = load(EXAMPLE)["profiles"][2]  # gpu-small
    return {
        "gpu-t4": Profile.from_config({**base, "id": "gpu-t4",
                                       "accelerator": {"type": "nvidia-tesla-t4", "count": 1}}),
        "gpu-h200": Profile.from_config({**base, "id": "gpu-h200", "accelerator": {
            "type": "nvidia-h200-141gb", "count": 2}}),
    }


@pytest.mark.parametrize(("wanted", "have", "matches"), [
    ("nvidia-l4", "nvidia-l4", True),
    ("nvidia-tesla-t4", "nvidia-t4", True),
    ("nvidia-h100-80gb", "nvidia-h100", True),
    ("nvidia-h100", "nvidia-h100-80gb", True),
    ("nvidia-h100", "nvidia-h10", False),
    ("nvidia-l4", "nvidia-tesla-t4", False),
])
def test_accelerator_matches(wanted: str, have: str, matches: bool) -> None:
    assert accelerator_matches(wanted, have) is matches


LOCAL = frozenset({"jupyterlab"})


@pytest.mark.parametrize(("request_", "host", "expected"), [
    (("ml-a", "cpu-small", "python-3-9", "jupyterlab"), None, "python-3-11"),
    (("ml-a", "gpu-small", "python-3-10", "jupyterlab"), None, "python-3-10"),
    (("ml-a", "tpu-v5e-8", "python-3-10", "jupyterlab"), None,
     Refusal(RefusalReason.ENVIRONMENT_NOT_ALLOWED,
             "environment python-3-10 is not offered on profile tpu-v5e-8; use one of: "
             "python-3-11.")),
    (("ml-a", "tpu-v5e-8", "python-3-11", "vscode"), None,
     Refusal(RefusalReason.IDE_UNAVAILABLE,
             "vscode is not available on this runtime (code-server not installed); use "
             "jupyterlab")),
    (("ml-b", "tpu-v5e-8", "python-3-11", "jupyterlab"), None, RefusalReason.PROFILE_NOT_ALLOWED),
    (("ml-a", "cpu-small", "legacy-tf1", "jupyterlab"), None, RefusalReason.ENVIRONMENT_HIDDEN),
    (("ml-a", "gpu-small", "python-3-11", "jupyterlab"), NO_GPU_HOST,
     RefusalReason.ACCELERATOR_UNAVAILABLE),
])
def test_resolve_request(catalog: Catalog, request_: tuple[str, str, str, str],
                         host: dict[str, Any] | None,
                         expected: str | Refusal | RefusalReason) -> None:
    result = catalog.resolve_request(*request_, available_ides=LOCAL, host_capabilities=host)
    if isinstance(expected, str) and not isinstance(expected, RefusalReason):
        assert isinstance(result, Resolved)
        assert result.value.environment.id == expected
        assert (result.value.team.id, result.value.profile.id) == request_[:2]
    elif isinstance(expected, RefusalReason):
        assert isinstance(result, Refusal) and result.reason == expected
    else:
        assert result == expected


def test_resolve_request_keeps_the_notices(catalog: Catalog) -> None:
    result = catalog.resolve_request("ml-a", "cpu-small", "python-3-9", "jupyterlab",
                                     available_ides=LOCAL)
    assert isinstance(result, Resolved)
    assert [n.kind for n in result.notices] == [NoticeKind.REDIRECTED]


def test_ide_allowed_by_the_profile(catalog: Catalog) -> None:
    result = catalog.resolve_request("ml-a", "tpu-v5e-8", "python-3-11", "vscode",
                                     available_ides={"jupyterlab", "vscode"})
    assert result == Refusal(RefusalReason.IDE_NOT_ALLOWED,
                             "vscode is not offered on profile tpu-v5e-8; use jupyterlab.")


def test_retention_team_override(catalog: Catalog) -> None:
    assert catalog.retention_for("ml-a", "cpu-small").max_age_days == 30
    overridden = catalog.retention_for("ml-b", "cpu-small")
    assert (overridden.max_age_days, overridden.keep_last) == (7, 5)


def test_environment_flags() -> None:
    def env(status: str, redirect: str | None = None) -> Environment:
        return Environment.from_config({"id": "e-1", "title": "t", "image": "i",
                                        "status": status, "redirect": redirect})

    assert (env("approved").usable, env("approved").listed) == (True, True)
    assert (env("deprecated", "x-1").usable, env("deprecated", "x-1").listed) == (True, False)
    assert (env("hidden").usable, env("unapproved").usable) == (False, False)


# --------------------------------------------------------------------------------------------
# Scheduling: priority classes, queue policy, borrowing, declared nodes
# --------------------------------------------------------------------------------------------


def test_scheduling_problems_are_reported_at_their_paths(example: dict[str, Any]) -> None:
    config = copy.deepcopy(example)
    config["scheduling"] = {
        "priority_classes": [{"id": "interactive", "value": 1}, {"id": "interactive",
                                                                  "value": 2}],
        "defaults": {"job": "batchy"},
        "nodes": [{"id": "n1", "accelerators": {"nvidia-l4": 1}},
                  {"id": "n1", "accelerators": {}}]}
    config["profiles"][0]["scheduling"] = {"priority_class": "urgent", "when_full": "refuse",
                                           "max_wait_seconds": 60}
    config["teams"][0]["borrowing_limit"] = {"gpus": 1}
    assert schema_paths(config) == []
    problems = {p.path: p.message for p in validate_config(config)}
    assert set(problems) == {"/scheduling/priority_classes/1/id", "/scheduling/defaults/job",
                             "/scheduling/nodes/1/id", "/profiles/0/scheduling/priority_class",
                             "/profiles/0/scheduling/max_wait_seconds",
                             "/teams/0/borrowing_limit"}
    assert "unknown priority class batchy" in problems["/scheduling/defaults/job"]
    assert "set cohort" in problems["/teams/0/borrowing_limit"]


def test_a_teams_class_wins_over_the_profiles_which_wins_over_the_default(
        example: dict[str, Any]) -> None:
    from functions.domain.catalog import WorkKind

    config = copy.deepcopy(example)
    gpu = next(p for p in config["profiles"] if p["id"] == "gpu-small")
    gpu["scheduling"] = {"priority_class": "batch"}
    catalog = Catalog.from_config(config)
    assert catalog.priority_for("ml-a", "gpu-small").id == "batch"
    assert catalog.priority_for("ml-a", "cpu-small").id == "interactive"
    assert catalog.priority_for("ml-a", "cpu-small", WorkKind.SANDBOX).id == "background"
    config["teams"][0]["priority_class"] = "background"
    assert Catalog.from_config(config).priority_for("ml-a", "gpu-small").id == "background"
    bare = copy.deepcopy(example)
    del bare["scheduling"]
    assert Catalog.from_config(bare).priority_for("ml-a", "gpu-small").id == "default"


def test_knows_says_whether_the_catalog_has_everything_a_request_names(
        example: dict[str, Any]) -> None:
    catalog = Catalog.from_config(example)
    assert catalog.knows()  # nothing named
    assert catalog.knows(team="ml-a", member="alice", slack_user="U0ALICE",
                         profile="gpu-small", environment="python-3-11", ide="vscode")
    assert catalog.knows(member="carol")  # a member of some team
    assert catalog.knows(profile="tpu-v5e-8")  # a profile of the catalog, no team named
    assert not catalog.knows(team="ml-c")
    assert not catalog.knows(team="ml-a", member="carol")  # carol is in ml-b only
    assert not catalog.knows(member="mallory")
    assert not catalog.knows(slack_user="U0NOBODY")
    assert not catalog.knows(team="ml-b", profile="tpu-v5e-8")  # not offered to ml-b
    assert not catalog.knows(profile="cpu-huge")
    assert not catalog.knows(environment="python-2-7")
    assert not catalog.knows(ide="emacs")
