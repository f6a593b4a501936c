"""Model providers behind one interface: OpenAI-compatible endpoints, the offline local model, scripted models."""
