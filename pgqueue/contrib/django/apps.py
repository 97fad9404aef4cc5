"""The Django application config of ``pgqueue.contrib.django``."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgQueueConfig(AppConfig):
    """Imports every installed app's ``tasks`` module once Django is ready, and
    prepares the ``django.tasks`` backends of pgqueue (see
    :mod:`pgqueue.contrib.django.tasks`)."""

    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"
    default = True

    def ready(self) -> None:
        autodiscover_modules("tasks")
        from pgqueue.contrib.django.tasks import prepare_backends

        prepare_backends()
