"""Discovered by pgqueue.contrib.django when Django starts.

Two kinds of task run in the same pgqueue workers: ``ship_order`` is a
pgqueue task (it completes in its own transaction), ``send_confirmation`` a
task of Django's own Tasks framework (``django.tasks`` on Django 6, the
``django-tasks`` backport before), stored by pgqueue's backend (see TASKS in
settings.py).
"""

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task

from pgqueue import JobContext
from pgqueue.contrib.django import app
from shop.orders.models import Order


@app.task(pass_context=True, max_attempts=3)
def ship_order(order_id: int, context: JobContext) -> None:
    # The order is marked shipped in the transaction that records this job
    # succeeded: a worker killed half-way leaves neither, never just one.
    with context.transaction() as conn:
        conn.execute("UPDATE orders_order SET shipped = true WHERE id = %s", (order_id,))


@task(queue_name="emails")
def send_confirmation(order_id: int) -> str:
    """A Django task: its result is read back with ``send_confirmation.get_result(id)``."""
    order = Order.objects.get(pk=order_id)
    return f"order {order.pk} ({order.item}) confirmed"
