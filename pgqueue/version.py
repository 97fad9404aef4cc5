"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against migrations/).
#: Chain: 0001, 0002, 0003, 0004, 0007, 0009, 0005, 0008, 0010, 0006, 0014.
SCHEMA_REVISION = "0014"
