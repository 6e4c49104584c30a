"""Running `ocx serve`: workers, supervisor, drain, background writers, metrics, logs, errors."""
