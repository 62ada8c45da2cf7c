"""policies/capacity."""
