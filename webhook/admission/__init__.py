"""webhook/admission."""
