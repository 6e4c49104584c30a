from __future__ import annotations

from django.apps import AppConfig


class OcxsiteConfig(AppConfig):
    """The project package: settings, URLs, the API's mounting, the CLI; wires the apps together."""

    name = "ocxsite"
    verbose_name = "ocx"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_delete, post_save

        from accounts.access import keys_changed
        from accounts.models import ClientKey, UserBudget
        from combos import live
        from gateway import live as live_loader
        from gateway.runtime import on_versions_committed
        from providers.services import versions_committed
        from routing import envpolicy
        from server.datafiles import new_sqlite_private

        for model in (ClientKey, UserBudget, settings.AUTH_USER_MODEL):
            post_save.connect(keys_changed, sender=model, dispatch_uid=f"keys-save-{model}")
            post_delete.connect(keys_changed, sender=model, dispatch_uid=f"keys-del-{model}")
        # A committed write is served at once: this process reloads, the other workers are told.
        versions_committed.connect(on_versions_committed, dispatch_uid="config-notify")
        # Status, badges and `ocx status` read the live state through the stores the server uses.
        live.register(live_loader.load)
        envpolicy.configure(
            envpolicy.EnvPolicy.of(settings.OCX_PROVIDER_ENV_DENY, settings.OCX_PROVIDER_ENV_ALLOW)
        )
        connection_created.connect(new_sqlite_private, dispatch_uid="sqlite-private")
