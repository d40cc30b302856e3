"""Who may see which calls: accounts with roles, and the scope every read of theirs runs in."""
