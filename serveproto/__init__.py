"""The serve protocol, sans-IO."""
