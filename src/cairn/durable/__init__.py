"""What Cairn keeps at rest, and how: envelope encryption (`crypto`), the master keys
(`keyring`), blobs sealed with their data keys in the database (`sealing`), and the rotation
that re-wraps those keys (`rotation`). Design invariant 6."""
