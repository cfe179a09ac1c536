"""gpud: an asyncio-native GPU task scheduler daemon."""

__version__ = "0.1.0"
