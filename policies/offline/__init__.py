"""policies/offline."""
