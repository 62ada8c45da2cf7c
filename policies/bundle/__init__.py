"""policies/bundle."""
