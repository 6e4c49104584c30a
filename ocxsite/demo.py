"""`ocx serve --demo`: a provider pair on the built-in mock upstream, `combo/demo`, a key."""

from __future__ import annotations

from accounts import access
from accounts.models import ClientKey
from combos import services as combo_services
from combos.models import Combo
from providers import services as provider_services

DEMO_KEY_NOTE = "demo"
DEMO_USER = "demo"
OLD_DEMO_USERS = ("mock",)  # releases before 2026-12 minted demo keys for "mock"


def demo_setup(*, proxy_url: str, mock_url: str) -> str:
    """Create (or refresh) the demo configuration and return the text to print."""
    base = mock_url.rstrip("/") + "/v1"
    provider_services.provider_set(
        name="mock",
        raw={
            "adapter": "openai-responses",
            "baseUrl": base,
            "apiKey": "mock-demo-key",
            "models": {
                "mock-large": {
                    "contextWindow": 200000,
                    "inputModalities": ["text", "image"],
                    "reasoningEfforts": ["low", "medium", "high"],
                },
            },
        },
    )
    provider_services.provider_set(
        name="mock-chat",
        raw={
            "adapter": "openai-chat",
            "baseUrl": base,
            "apiKey": "mock-demo-key",
            "models": {
                "mock-small": {
                    "contextWindow": 128000,
                    "inputModalities": ["text"],
                    "reasoningEfforts": ["low", "medium"],
                }
            },
        },
    )
    combo_services.combo_set(
        combo_id="demo",
        raw={
            "targets": [
                {"provider": "mock", "model": "mock-large"},
                {"provider": "mock-chat", "model": "mock-small"},
            ],
            "displayName": "Demo combo",
        },
    )
    assert Combo.objects.filter(combo_id="demo").exists()
    # Idempotent: one demo user, one live demo key (the secret is shown once, so a restart
    # mints a new key and revokes the previous ones rather than leaving them active).
    previous = ClientKey.objects.filter(
        user__username__in=(DEMO_USER, *OLD_DEMO_USERS), name=DEMO_KEY_NOTE
    )
    revoked = access.client_keys_revoke(keys=previous)
    _, secret = access.client_key_create(username=DEMO_USER, name=DEMO_KEY_NOTE)
    note = f"  (revoked {revoked} previous demo key(s))" if revoked else ""
    return f"""
ocx demo is ready.
  mock upstream: {mock_url}
  combo:         combo/demo  (mock/mock-large, then mock-chat/mock-small)
  client key:    {secret}   (user {DEMO_USER}, shown once){note}

Try it:
  curl -sN {proxy_url}/v1/responses \\
    -H "Authorization: Bearer {secret}" -H "Content-Type: application/json" \\
    -d '{{"model":"combo/demo","input":"Say hello","stream":true}}'

Admin and dashboard: {proxy_url}/admin/  (create a login first:
  ocx user create NAME --staff   — with the same OCX_DATA_DIR as this server)

Codex (~/.codex/config.toml):
  model = "combo/demo"
  model_provider = "ocx"

  [model_providers.ocx]
  name = "ocx"
  base_url = "{proxy_url}/v1"
  wire_api = "responses"
  env_key = "OCX_API_KEY"      # export OCX_API_KEY={secret}
"""
