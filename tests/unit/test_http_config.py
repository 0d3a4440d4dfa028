"""The [http], [proxy] and [webhooks] settings from the environment, API keys (never from the
TOML file), and the tenant's internal conversation ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.api.auth import ApiKeys, Tenant, bearer, load_api_keys
from worker.config import load_settings, settings_from_mapping
from worker.errors import ConfigError, InvalidSnapshot

KEY = "a-key-of-sixteen-or-more"


def test_environment_sets_the_new_sections(tmp_path: Path) -> None:
    env = {
        "COMPACTOR_CONFIG": str(tmp_path / "none.toml"),
        "COMPACTOR_HTTP_PORT": "9000",
        "COMPACTOR_HTTP_HOST": "0.0.0.0",
        "COMPACTOR_PROXY_OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
        "COMPACTOR_WEBHOOKS_ALLOW_PRIVATE": "true",
        "COMPACTOR_HTTP_MAX_BODY_BYTES": "none",
    }
    (tmp_path / "none.toml").write_text("")
    settings = load_settings(environ=env)
    assert settings.http.port == 9000 and settings.http.host == "0.0.0.0"
    assert settings.proxy.openai_base_url == "http://127.0.0.1:1/v1"
    assert settings.webhooks.allow_private is True
    assert settings.http.max_body_bytes is None


def test_api_keys_never_come_from_the_toml_file() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"http": {"api_keys": {KEY: "acme"}}})
    assert caught.value.key == "http.api_keys"


def test_api_keys_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({KEY: "acme", KEY + "2": "globex"}))
    settings = settings_from_mapping({"http": {"api_keys_file": str(path)}})
    keys = load_api_keys(settings, {"COMPACTOR_API_KEYS": json.dumps({KEY + "2": "initech"})})
    assert keys.tenant(KEY) == Tenant("acme")
    assert keys.tenant(KEY + "2") == Tenant("initech")  # the environment wins
    assert keys.tenant("wrong") is None and keys.tenant(None) is None
    assert len(load_api_keys(settings_from_mapping({}), {})) == 0


@pytest.mark.parametrize(
    "text",
    ["[1]", "not json", json.dumps({"short": "acme"}), json.dumps({KEY: "a:b"}), '{"k": 1}'],
)
def test_bad_api_keys_are_config_errors_that_never_show_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_api_keys(settings_from_mapping({}), {"COMPACTOR_API_KEYS": text})
    assert KEY not in str(caught.value)


def test_the_internal_id_carries_the_tenant_and_stays_valid() -> None:
    acme = Tenant("acme")
    assert acme.internal("c-42") == "acme:c-42"
    assert acme.external("acme:c-42") == "c-42"
    assert acme.internal("x" * 123) == "acme:" + "x" * 123
    for bad in ("x" * 124, ".hidden", "", "a/b"):
        with pytest.raises(InvalidSnapshot):
            acme.internal(bad)


def test_bearer() -> None:
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer abc") == "abc"
    assert bearer("Basic abc") is None
    assert bearer(None) is None and bearer("Bearer ") is None
    assert ApiKeys({KEY: "acme"}).tenant(KEY + "x") is None
