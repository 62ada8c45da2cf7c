"""webhook/loops."""
