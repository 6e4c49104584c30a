"""Running `ocx serve`: workers, supervisor, drain, background writers, metrics, logs, errors,
the data directory's files (`paths`, `datafiles`: the database, server.json) and `ocx status`."""
