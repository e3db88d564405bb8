"""What every service shares: the error hierarchy and envelope, the app factory, settings base."""
