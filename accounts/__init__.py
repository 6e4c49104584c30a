"""Who may call: client keys, management tokens, users and their budgets (an app)."""
