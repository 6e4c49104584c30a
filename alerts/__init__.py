"""Alerts: destinations (Slack, webhook, e-mail), the outbox of messages and its sender."""
