"""SIPREC (RFC 7866): callqa's gateway as a session recording server for SBCs and PBXs (README.md here)."""
