"""Environments and tools: the TextWorld suite (registered as entry point ``textworld``)."""
