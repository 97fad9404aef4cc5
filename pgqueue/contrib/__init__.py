"""Integrations with web frameworks; nothing here is imported by ``import pgqueue``."""
