"""webhook/cli."""
