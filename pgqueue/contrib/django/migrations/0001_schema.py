"""pgqueue's schema (Alembic revision 0001, the baseline), applied by ``manage.py migrate``."""

from django.db import migrations

from pgqueue.contrib.django.schema import ApplySchema


class Migration(migrations.Migration):
    initial = True
    # pgqueue's migrations run in a transaction of their own (an advisory lock
    # per schema serialises concurrent ones), on a connection of their own.
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [ApplySchema(reverse_to=None)]
