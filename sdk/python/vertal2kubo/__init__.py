"""Vertal Run clients: the API client (vertal2kubo.client), the command
line (python -m vertal2kubo) and an MCP server for AI agents
(python -m vertal2kubo.mcp), and verify_webhook for webhook receivers
(vertal2kubo.webhook). Standard library only."""

from .client import KuboClient, KuboError
from .sandbox import Sandbox
from .webhook import WebhookVerificationError, verify_webhook

__version__ = "0.2.0"
__all__ = ["KuboClient", "KuboError", "Sandbox", "WebhookVerificationError", "verify_webhook", "__version__"]
