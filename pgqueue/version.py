"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against migrations/).
#: (chain: 0004, 0007, 0009, 0005, 0008, 0010, 0006, 0012).
SCHEMA_REVISION = "0012"
