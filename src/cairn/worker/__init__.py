"""The worker: claims jobs from the queue under leases and runs them."""
