"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against migrations/).
#: 0011 (lean lease) runs after 0006 (task registry), which runs after 0010
#: (chain: 0004, 0007, 0009, 0005, 0008, 0010, 0006, 0011); 0015 (serial held) after 0011.
SCHEMA_REVISION = "0015"
