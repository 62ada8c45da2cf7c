"""policies/cel."""
