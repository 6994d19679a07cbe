"""The S3 tests' bucket on the session's SeaweedFS (the `seaweedfs` fixture of tests/conftest.py
creates it; tests keep to a prefix of their own or empty it first)."""

BUCKET = "kubeckpt-test"
