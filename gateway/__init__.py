"""The `/v1` front door and its per-process runtime: proxy, config reloads, events socket."""
