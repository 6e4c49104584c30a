"""What was spent: the request log, usage rollups, budgets and their events (an app)."""
