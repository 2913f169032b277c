"""Examples that use seed-agents but are not part of it: the continual demo's library
service (a production API with a sandbox twin) and the tool-agent benchmark's knowledge base.
Run from the checkout; nothing here is installed."""
