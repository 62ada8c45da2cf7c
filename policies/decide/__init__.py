"""policies/decide."""
