"""Storage: one SQLAlchemy Core schema and its queries for SQLite and PostgreSQL, with migrations."""
