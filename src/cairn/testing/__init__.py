"""Test support shipped with Cairn: a throwaway PostgreSQL server and a Cairn server process,
for Cairn's own tests and benchmarks and for users testing code built on Cairn."""
