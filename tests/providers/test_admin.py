from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from providers.models import Provider
from providers.sealing import unseal

pytestmark = pytest.mark.django_db

SECRET = "sk-admin-test-abcdefghijklmnop1234"


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def _post(**overrides: str) -> dict[str, str]:
    data = {
        "name": "openai",
        "adapter": "openai-responses",
        "base_url": "https://api.example.com/v1",
        "api_key_env": "",
        "api_key": SECRET,
        "headers": "{}",
        "connect_ms": "5000",
        "first_byte_ms": "20000",
        "idle_ms": "60000",
        "total_ms": "600000",
        "models-TOTAL_FORMS": "1",
        "models-INITIAL_FORMS": "0",
        "models-MIN_NUM_FORMS": "0",
        "models-MAX_NUM_FORMS": "1000",
        "models-0-model_id": "gpt-x",
        "models-0-context_window": "200000",
        "models-0-input_modalities": "text,image",
        "models-0-reasoning_efforts": "low,medium,high",
    }
    data.update(overrides)
    return data


def test_admin_stores_key_encrypted_and_never_shows_it(staff: Client) -> None:
    response = staff.post("/admin/providers/provider/add/", _post())
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(name="openai")
    assert SECRET not in provider.api_key_sealed
    assert unseal(provider.api_key_sealed) == SECRET
    model = provider.models.get()
    assert model.reasoning_efforts == ["low", "medium", "high"]
    assert model.input_modalities == ["text", "image"]
    page = staff.get(f"/admin/providers/provider/{provider.pk}/change/").content.decode()
    assert SECRET not in page
    assert "…1234" in page
    listing = staff.get("/admin/providers/provider/").content.decode()
    assert SECRET not in listing


def test_admin_empty_key_keeps_stored_key(staff: Client) -> None:
    staff.post("/admin/providers/provider/add/", _post())
    provider = Provider.objects.get(name="openai")
    data = _post(api_key="", **{"models-TOTAL_FORMS": "0"})
    response = staff.post(f"/admin/providers/provider/{provider.pk}/change/", data)
    assert response.status_code == 302
    assert unseal(Provider.objects.get(name="openai").api_key_sealed) == SECRET


def test_admin_rejects_non_http_base_url(staff: Client) -> None:
    response = staff.post("/admin/providers/provider/add/", _post(base_url="ftp://example.com"))
    assert response.status_code == 200
    assert "baseUrl" in response.content.decode()
    assert not Provider.objects.exists()


def test_admin_rejects_unknown_effort_in_model_ladder(staff: Client) -> None:
    response = staff.post(
        "/admin/providers/provider/add/", _post(**{"models-0-reasoning_efforts": "low,turbo"})
    )
    assert response.status_code == 200
    assert "reasoningEfforts" in response.content.decode()
    assert not Provider.objects.exists()


def test_admin_sets_and_validates_max_connections(staff: Client) -> None:
    response = staff.post("/admin/providers/provider/add/", _post(max_connections="0"))
    assert response.status_code == 200
    assert "maxConnections must be an integer from 1 to 1000000" in response.content.decode()
    assert not Provider.objects.exists()
    response = staff.post("/admin/providers/provider/add/", _post(max_connections="2000"))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Provider.objects.get(name="openai").max_connections == 2000
