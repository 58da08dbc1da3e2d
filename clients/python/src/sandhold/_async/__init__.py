"""The asyncio client (made into the blocking one in _sync/)."""
