"""Gateway: engine supervisor, HTTP server, Jev routes."""
