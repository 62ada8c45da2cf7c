"""policies/job."""
