"""The shop's tests: ``python manage.py test``.

Django's test runner creates the test database and migrates it, which puts
pgqueue's schema in it too; pgqueue's App and the ``PgQueueBackend`` follow
Django there. ``drain`` runs the jobs that are ready in this process, through
the code of ``manage.py pgqueue worker`` (the tasks' transactions, retries and
results as a worker stores them).

The tests are ``TransactionTestCase``s: a worker, and so ``drain``, sees only
committed jobs, and a ``TestCase`` never commits.
"""

from django.test import TransactionTestCase

from pgqueue.contrib.django import app
from pgqueue.testing import drain, refute_enqueued
from shop.orders.models import Order
from shop.orders.tasks import send_confirmation

try:
    from django.tasks import TaskResultStatus
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import TaskResultStatus


class OrderTests(TransactionTestCase):
    def test_an_order_is_shipped_and_confirmed(self) -> None:
        placed = self.client.post("/orders?item=book")
        self.assertEqual(placed.status_code, 201)
        body = placed.json()
        confirmation = send_confirmation.get_result(body["confirmation"])
        self.assertEqual(confirmation.status, TaskResultStatus.READY)

        ran = drain(app)

        self.assertEqual((ran.succeeded, ran.total), (2, 2))  # ship_order and send_confirmation
        order = Order.objects.get(pk=body["order"])
        self.assertTrue(order.shipped)
        confirmation.refresh()
        self.assertEqual(confirmation.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(confirmation.return_value, f"order {order.pk} (book) confirmed")
        shown = self.client.get(f"/confirmations/{confirmation.id}").json()
        self.assertEqual(shown["status"], "SUCCESSFUL")

    def test_a_declined_payment_leaves_neither_order_nor_jobs(self) -> None:
        declined = self.client.post("/orders?item=pen&fail=1")
        self.assertEqual(declined.status_code, 402)
        self.assertFalse(Order.objects.exists())
        refute_enqueued(app)
        self.assertEqual(drain(app).total, 0)
