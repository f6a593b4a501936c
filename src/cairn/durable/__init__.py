"""durable package."""
