"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against migrations/).
#: Chain: 0001, 0002, 0003, 0004, 0007, 0009, 0005, 0008, 0010, 0006, 0011
#: (lean lease), 0013 (worker identity), 0014 (admin replay), 0012 (fast
#: enqueue), 0015 (held serial keys), 0016 (observed lease), 0017 (lean
#: enqueue). Numbers were assigned when the work was split; the chain is linear.
SCHEMA_REVISION = "0017"
