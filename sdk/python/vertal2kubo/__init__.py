"""Vertal Run clients: the API client (vertal2kubo.client), the command
line (python -m vertal2kubo) and an MCP server for AI agents
(python -m vertal2kubo.mcp). Standard library only."""

from .client import KuboClient, KuboError

__version__ = "0.2.0"
__all__ = ["KuboClient", "KuboError", "__version__"]
