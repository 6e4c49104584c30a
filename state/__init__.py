"""Shared state on Redis: the RESP client, the breaker, routing, quota, recall, counter stores."""
