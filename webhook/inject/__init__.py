"""webhook/inject."""
