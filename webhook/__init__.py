"""kubeckpt admission webhook: injects checkpoint and progress settings into training pods."""
